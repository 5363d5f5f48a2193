"""OpenAI's embeddings API over HTTP: ``POST /v1/embeddings``, ``GET /v1/models`` and ``GET /v1/models/{model}``.

A codec of its own over the data plane the V2 routes use, as text-embeddings-inference and Infinity put these
routes beside their own: the body decoded into the embedding pipeline's texts (or token ids), the answer written
as OpenAI's list of embeddings with the tokens the tokenizer counted, every error in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``). Admission, deadlines, the cache, batching, metrics, traces
and the access line are the data plane's, as for V2. Answered as plain ASGI, like V2's inference, so neither a
Lambda container's first embedding nor a server's waits for FastAPI.
"""

from __future__ import annotations

import base64
import math
import os
from typing import Any

import numpy as np
import orjson

from fnserve.adapters.http.infer import (
    JSON,
    ASGIMessage,
    InferenceRoute,
    Receive,
    Send,
    json_object,
    read_body,
    request_headers,
    respond_json,
)
from fnserve.adapters.http.wire import header_request_id, respond, unnamed_request_id
from fnserve.core.errors import FnserveError, InvalidInput
from fnserve.core.execution.deadline import RequestTooLong
from fnserve.core.execution.embeddings import (
    TOKENS,
    TRUNCATED,
    Embedder,
    TokenIds,
    cut_length,
    embedders,
    prompted,
    shorten,
)
from fnserve.core.serving.dataplane import Answer
from fnserve.observability.envelope import RequestRecorder

MAX_INPUTS = 2048  # OpenAI's own bound on a request's inputs
EMBEDDINGS = "/v1/embeddings"
MODELS = "/v1/models"
TRUNCATED_HEADER = "x-fnserve-truncated"  # the indexes of the inputs cut to the model's max_length


class OpenAIError(FnserveError):
    """A refusal in OpenAI's terms: its status, and the field at fault (``param``) and a ``code`` where one fits."""

    def __init__(self, message: str, status_code: int = 400, param: str | None = "input", code: str | None = None):
        super().__init__(message, status_code)
        self.param = param
        self.code = code


def unknown(model: object) -> OpenAIError:
    return OpenAIError(f"The model {model!r} does not exist", 404, "model", "model_not_found")


def error_parts(error: FnserveError) -> tuple[int, bytes, dict[str, str]]:
    """An error as these routes answer it: OpenAI's body, a 4xx about the input as its 400, ``Retry-After``."""
    status = 400 if error.status_code == 422 else error.status_code
    param: str | None = "input"
    code = None
    if isinstance(error, OpenAIError):
        param, code = error.param, error.code
    elif isinstance(error, RequestTooLong):  # the limit it is over, as OpenAI names its own
        code = error.code
    elif status == 401:  # OpenAI's own answer to a wrong key
        param, code = None, "invalid_api_key"
    elif status == 404:
        param, code = "model", "model_not_found"
    elif status >= 500:
        param = None
        code = {503: "overloaded", 504: "timeout"}.get(status)
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = orjson.dumps({"error": {"message": error.message, "type": kind, "param": param, "code": code}})
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else {}
    return status, body, headers


class EmbeddingsRequest:
    """An embeddings request as the data plane takes it: its body read and parsed once admitted (or before, where
    the server embeds with more than one model and the body names which: ``doc``), then checked field by field;
    its answer written as OpenAI's list."""

    __slots__ = (
        *("name", "traceparent", "deadline", "_doc", "_receive", "_declared", "_routes"),
        *("inputs", "outputs", "timeout", "_embedder", "_dimensions", "_base64"),
    )
    version = None

    def __init__(
        self,
        routes: OpenAIRoutes,
        name: str,
        doc: dict[str, Any] | None,
        receive: Receive,
        declared: str | None,
        traceparent: str | None,
        deadline: float | None,
    ) -> None:
        self._routes = routes
        self.name = name
        self._doc = doc
        self._receive = receive
        self._declared = declared
        self.traceparent = traceparent
        self.deadline = deadline
        self.timeout: float | None = None
        self.inputs: dict[str, np.ndarray[Any, Any]] = {}
        self.outputs: tuple[str, ...] = ()
        self._embedder: Embedder | None = None
        self._dimensions: int | None = None
        self._base64 = False

    async def decoded(self) -> EmbeddingsRequest:
        doc = self._doc
        if doc is None:
            doc = parse(await read_body(self._receive, self._declared, self._routes.limit))
        if doc["model"] != self.name:
            raise unknown(doc["model"])
        embedder = self._embedder = self._routes.embedders[self.name]
        texts = texts_of(doc.get("input", _MISSING))
        try:  # prompt_name is not OpenAI's: TEI's and sentence-transformers' name for it
            texts = prompted(texts, embedder.prompts, doc.get("prompt_name"), self.name)
        except InvalidInput as exc:
            raise OpenAIError(exc.message, param="prompt_name") from None
        self.inputs = {embedder.text: texts}
        self.outputs = embedder.outputs
        fmt = doc.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise OpenAIError(f"encoding_format must be 'float' or 'base64', got {fmt!r}", param="encoding_format")
        self._base64 = fmt == "base64"
        user = doc.get("user")
        if user is not None and not isinstance(user, str):
            raise OpenAIError("user must be a string", param="user")
        dimensions = doc.get("dimensions")
        if dimensions is not None:
            self._dimensions = self._routes.dimensions(embedder, dimensions)
        return self

    def encode(self, answer: Answer) -> tuple[bytes, str, dict[str, str]]:
        assert self._embedder is not None, "encoded before it was decoded"
        outputs = answer.outputs
        vectors = outputs[self._embedder.output]
        if self._dimensions is not None and self._dimensions != vectors.shape[1]:
            vectors = shorten(vectors, self._dimensions)
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        if self._base64:
            data = [
                {"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode("ascii")}
                for i, row in enumerate(vectors)
            ]
        else:
            data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(vectors)]
        tokens = int(outputs[TOKENS].sum())
        doc = {
            "object": "list",
            "data": data,
            "model": self.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        headers: dict[str, str] = {}
        truncated = np.flatnonzero(outputs[TRUNCATED])
        if len(truncated):
            headers[TRUNCATED_HEADER] = ",".join(map(str, truncated.tolist()))
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), JSON, headers


_MISSING: Any = object()
_HEADERS = frozenset({b"content-length", b"traceparent", b"accept-encoding", b"x-stainless-read-timeout"})


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object naming its model, or the 400 saying what it is not."""
    doc = json_object(raw, lambda message: OpenAIError(message, param=None))
    model = doc.get("model")
    if not isinstance(model, str):
        raise OpenAIError("model is required: the id of an embedding model (GET /v1/models)", param="model")
    return doc


def texts_of(value: Any, field: str = "input", limit: int = MAX_INPUTS) -> np.ndarray[Any, Any]:
    """``value`` (a request's ``field``) as one row a text: a string, strings, token ids, or lists of token ids (each a
    :class:`TokenIds`), at most ``limit`` of them; else the :class:`InvalidInput` saying what it is not."""
    if value is _MISSING or value is None:
        raise InvalidInput(f"{field} is required: a string, an array of strings, or token ids")
    if isinstance(value, str):
        rows: list[Any] = [value]
    elif isinstance(value, list):
        if not value:
            raise InvalidInput(f"{field} must not be an empty array")
        if all(isinstance(v, str) for v in value):
            rows = value
        elif all(_is_id(v) for v in value):
            rows = [TokenIds(value)]
        elif all(isinstance(v, list) for v in value):
            for i, ids in enumerate(value):
                if not ids or not all(_is_id(v) for v in ids):
                    raise InvalidInput(f"{field}[{i}] must be a non-empty array of token ids (integers)")
            rows = [TokenIds(ids) for ids in value]
        else:
            raise InvalidInput(
                f"{field} must be a string, an array of strings, an array of token ids, or an array of such"
            )
    else:
        raise InvalidInput(f"{field} must be a string or an array, got {type(value).__name__}")
    if len(rows) > limit:
        raise InvalidInput(f"{field} has {len(rows)} items; at most {limit} a request")
    for i, row in enumerate(rows):
        if isinstance(row, str) and not row:
            raise InvalidInput(f"{field}[{i}] is an empty string" if len(rows) > 1 else f"{field} is an empty string")
    array = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):  # one by one: a slice assignment would spread token ids over a second axis
        array[i] = row
    return array


def _is_id(value: Any) -> bool:
    return type(value) is int


class OpenAIRoutes:
    """The OpenAI routes over one data plane: which of its pipelines embed text, the requests, the answers."""

    def __init__(self, inference: InferenceRoute) -> None:
        self.inference = inference
        self.plane = inference.plane
        self.limit = inference.limit
        self.recorder = RequestRecorder(
            "http", inference.recorder.telemetry, access_log=inference.recorder.access_log, route=EMBEDDINGS
        )
        manifest = self.plane.service.registry.manifest
        self.embedders = embedders(manifest)
        # Where a server embeds with one model (the usual deployment), requests are admitted before their body.
        self.only = next(iter(self.embedders)) if len(self.embedders) == 1 else None
        self.created = {name: _created(manifest, name) for name in self.embedders}

    def dimensions(self, embedder: Embedder, asked: Any) -> int:
        """A request's ``dimensions``: its full length, or one the model was trained to be cut to; else a 400."""
        try:
            return cut_length(embedder, self.plane.service, asked)
        except InvalidInput as exc:
            raise OpenAIError(exc.message, param="dimensions") from None

    # -- routes (ASGI) ---------------------------------------------------------------------------

    async def embeddings(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        """``POST /v1/embeddings``."""
        rid, found = request_headers(scope, _HEADERS)
        declared, traceparent = found.get(b"content-length"), found.get(b"traceparent")
        stainless = found.get(b"x-stainless-read-timeout")  # the openai client's own wait: past it, nobody reads
        deadline = _seconds(stainless) if stainless is not None else None

        async def answer() -> tuple[bytes, dict[str, str]]:
            name, doc = self.only, None
            if name is None:  # the body says which model: read it first
                doc = parse(await read_body(receive, declared, self.limit))
                name = doc["model"]
                if name not in self.embedders:
                    raise unknown(name)
            request = EmbeddingsRequest(self, name, doc, receive, declared, traceparent, deadline)
            served = await self.plane.serve(self.recorder, request)
            payload, _, headers = self.inference.http_response(served, found.get(b"accept-encoding"))
            return payload, headers  # Server-Timing, the cache, compression

        await respond_json(scope, send, rid, answer, error_parts)

    async def models(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``GET /v1/models`` and ``GET /v1/models/{model}``."""
        rid = unnamed_request_id(scope)
        for key, value in scope["headers"]:
            if key == b"x-request-id" and value:
                rid = header_request_id(value)
        name = model
        headers: dict[str, str] = {}
        if name is None:
            doc: dict[str, Any] = {"object": "list", "data": [self._model(n) for n in self.embedders]}
            status, payload = 200, orjson.dumps(doc)
        elif name in self.embedders:
            status, payload = 200, orjson.dumps(self._model(name))
        else:
            status, payload, headers = error_parts(unknown(name))
        await respond(scope, send, status, payload, JSON, headers, rid)

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created[name], "owned_by": "fnserve"}


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _created(manifest: Any, name: str) -> int:
    """When the embedding pipeline's model file was written (0 where it is not a local file)."""
    pipeline = next(p for p in manifest.pipelines if p.name == name)
    model = next((m for m in manifest.models if m.name == pipeline.model), None)
    if model is None:
        return 0
    path = model.path if os.path.isabs(model.path) else os.path.join(manifest.base_dir, model.path)
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0
