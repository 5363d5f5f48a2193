"""text-embeddings-inference's own API over HTTP: ``POST /embed``, ``/rerank``, ``/predict``, ``/tokenize``, ``POST /``
(by the model's kind, as TEI's does), ``GET /info`` and ``GET /health``, so ``huggingface_hub``'s ``InferenceClient``,
LlamaIndex's ``TextEmbeddingsInference`` and Haystack's TEI components call fnserve unchanged.

A TEI server serves one model and its clients post to the URL they are given: the server's TEI model
(``FNSERVE_TEI_MODEL``) answers at the root, and every pipeline of a kind TEI serves (an embedder, a reranker, a text
classifier) under ``/tei/{model}``. A codec over the data plane, as the OpenAI and Cohere routes are: admission before
the body, deadlines, the cache, batching by tokens, metrics, traces and the access line are the data plane's; errors
are TEI's ``{"error", "error_type"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from fnserve import __version__
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
from fnserve.adapters.http.openai import texts_of
from fnserve.adapters.http.rerank import SCORE, Reranker, rerankers
from fnserve.adapters.http.wire import respond
from fnserve.core.errors import ConfigError, FnserveError
from fnserve.core.execution.embeddings import (
    TOKENS,
    Embedder,
    TokenIds,
    cut_length,
    embedders,
    prompted,
    shorten,
)
from fnserve.core.models.manifest.loading import Manifest
from fnserve.core.models.manifest.pipelines import PipelineSettings
from fnserve.core.models.manifest.steps import MeanPoolStep, PoolStep, SigmoidStep, SoftmaxStep, TokenizeStep, TopKStep
from fnserve.core.serving.dataplane import Answer
from fnserve.observability.envelope import RequestRecorder

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_CLIENT_BATCH = 2048  # a request's texts (or a rerank's documents): Infinity's bound, TEI's is a setting
_HEADERS = frozenset({b"content-length", b"traceparent", b"accept-encoding"})
_MISSING: Any = object()


class TEIError(FnserveError):
    """A refusal in TEI's terms: its status and ``error_type`` (``Validation``: 422, unless said)."""

    def __init__(self, message: str, status_code: int = 422, error_type: str = "Validation") -> None:
        super().__init__(message, status_code)
        self.error_type = error_type


def error_parts(error: FnserveError) -> tuple[int, bytes, dict[str, str]]:
    """An error as TEI answers it: ``{"error", "error_type"}`` with its status, and ``Retry-After`` where known."""
    status = error.status_code
    if isinstance(error, TEIError):
        kind = error.error_type
    elif status in (429, 503):
        kind = "Overloaded"
    elif status == 404:
        kind = "NotFound"
    elif status == 401:
        kind = "Unauthorized"
    else:
        kind = "Validation" if status < 500 else "Backend"
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else {}
    return status, orjson.dumps({"error": error.message, "error_type": kind}), headers


@dataclass(frozen=True, slots=True)
class Classifier:
    """A pipeline served as a text classifier: the input that takes its text, the top-k step's outputs (every label,
    best first), the logits the activation reads (for raw scores), and the labels in class order."""

    name: str
    text: str
    labels_output: str
    scores_output: str
    logits: str | None
    labels: tuple[str, ...]


def classifiers(manifest: Manifest) -> dict[str, Classifier]:
    """Every pipeline of ``manifest`` that classifies one text: tokenize (no pair) first, a labelled top-k last."""
    found: dict[str, Classifier] = {}
    for pipeline in manifest.pipelines:
        first = pipeline.pre[0] if pipeline.pre else None
        top = pipeline.post[-1] if pipeline.post else None
        if not isinstance(first, TokenizeStep) or first.pair is not None or not isinstance(top, TopKStep):
            continue
        if top.labels is None or not _answers(pipeline, top.labels_output, top.scores_output):
            continue
        try:
            lines = (Path(manifest.base_dir) / top.labels).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue  # the pipeline cannot be built either: it answers its own error when asked
        labels = tuple(line.strip() for line in lines if line.strip())
        activation = next(
            (s for s in pipeline.post if isinstance(s, SoftmaxStep | SigmoidStep) and s.output == top.input), None
        )
        # The model's own logits are an answer only where the pipeline lists them (a step reads them otherwise).
        listed = pipeline.outputs is not None and activation is not None and activation.input in pipeline.outputs
        logits = activation.input if listed and activation is not None else None
        found[pipeline.name] = Classifier(
            pipeline.name, first.input, top.labels_output, top.scores_output, logits, labels
        )
    return found


def _answers(pipeline: PipelineSettings, *names: str) -> bool:
    return pipeline.outputs is None or all(n in pipeline.outputs for n in names)


def _truncating(doc: dict[str, Any]) -> bool:
    """A request's ``truncate`` (TEI's ``auto_truncate`` where unset) and ``truncation_direction``, checked."""
    truncate = _flag(doc, "truncate", default=True)
    direction = doc.get("truncation_direction")
    if direction is not None and direction not in ("Right", "right"):
        if direction in ("Left", "left"):
            raise TEIError("truncation_direction Left is not served: fnserve cuts a text's end (Right)")
        raise TEIError(f"truncation_direction must be Right or Left, got {direction!r}")
    return truncate


def _flag(doc: dict[str, Any], name: str, default: bool = False) -> bool:
    value = doc.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TEIError(f"{name} must be a boolean, got {value!r}")
    return value


def _parse(raw: bytes) -> dict[str, Any]:
    return json_object(raw, lambda message: TEIError(message, 400))


def _empty(name: str) -> TEIError:
    return TEIError(f"`{name}` cannot be empty", 400, "Empty")


class TEIRequest:
    """A request to one of the TEI routes that infer, as the data plane takes it: the body read once admitted, read
    by the route's :meth:`read`; its answer written by :meth:`written`."""

    __slots__ = ("name", "traceparent", "deadline", "timeout", "inputs", "outputs", "_routes", "_receive", "_declared")
    version = None

    def __init__(self, routes: TEIRoutes, name: str, receive: Receive, found: dict[bytes, str]) -> None:
        self._routes, self._receive, self._declared = routes, receive, found.get(b"content-length")
        self.name = name
        self.traceparent = found.get(b"traceparent")
        self.deadline: float | None = None
        self.timeout: float | None = None
        self.inputs: dict[str, np.ndarray[Any, Any]] = {}
        self.outputs: tuple[str, ...] = ()

    async def decoded(self) -> TEIRequest:
        self.read(_parse(await read_body(self._receive, self._declared, self._routes.limit)))
        return self

    def read(self, doc: dict[str, Any]) -> None:
        raise NotImplementedError

    def body(self, outputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        """The JSON document TEI answers this route with, from the pipeline's ``outputs``."""
        raise NotImplementedError

    def encode(self, answer: Answer) -> tuple[bytes, str, dict[str, str]]:
        outputs = answer.outputs
        headers = {"x-compute-tokens": str(int(outputs[TOKENS].sum()))} if TOKENS in outputs else {}
        return orjson.dumps(self.body(outputs), option=orjson.OPT_SERIALIZE_NUMPY), JSON, headers

    def _untruncated(self, doc: dict[str, Any], texts: list[Any], pairs: list[Any] | None = None) -> None:
        """With ``truncate: false``, the 422 TEI answers for a text longer than the model's ``max_input_length``."""
        if _truncating(doc):
            return
        longest = self._routes.max_length[self.name]
        counts = self._routes.lengths(self.name, texts, pairs)
        for i, count in enumerate(counts):
            if count > longest:
                raise TEIError(
                    f"`inputs` must have less than {longest} tokens. Given: {count} (inputs[{i}]); "
                    "send truncate: true to cut it"
                )


class EmbedRequest(TEIRequest):
    """``POST /embed``: ``inputs`` (a text, token ids, or a list of either) in; one embedding a row out."""

    __slots__ = ("_embedder", "_dimensions", "_normalize")

    def read(self, doc: dict[str, Any]) -> None:
        embedder = self._embedder = self._routes.embedders[self.name]
        value = doc.get("inputs", _MISSING)
        if value == []:
            raise _empty("inputs")
        texts = texts_of(value, "inputs", MAX_CLIENT_BATCH)
        texts = prompted(texts, embedder.prompts, doc.get("prompt_name"), self.name)
        self._untruncated(doc, texts.tolist())  # every row counted, text or token ids, by its place
        self._normalize = _flag(doc, "normalize", default=True)
        dimensions = doc.get("dimensions")
        self._dimensions = None if dimensions is None else cut_length(embedder, self._routes.plane.service, dimensions)
        self.inputs = {embedder.text: texts}
        self.outputs = (embedder.output, TOKENS)

    def body(self, outputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        vectors = outputs[self._embedder.output]
        if self._dimensions is not None and self._dimensions != vectors.shape[1]:
            vectors = shorten(vectors, self._dimensions)
        elif self._normalize and not self._routes.normalized[self.name]:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return np.ascontiguousarray(vectors, dtype=np.float32)


class RerankRequest(TEIRequest):
    """``POST /rerank``: a ``query`` and its ``texts`` in; every text's score, best first (ties: the later first)."""

    __slots__ = ("_texts", "_raw", "_return")

    def read(self, doc: dict[str, Any]) -> None:
        reranker = self._routes.rerankers[self.name]
        query, texts = doc.get("query"), doc.get("texts")
        if not isinstance(query, str) or not query.strip():
            raise TEIError("query must be a non-empty string")
        if texts == []:
            raise _empty("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) and t for t in texts):
            raise TEIError("texts must be a list of non-empty strings")
        if len(texts) > MAX_CLIENT_BATCH:
            raise TEIError(f"batch size {len(texts)} > maximum allowed batch size {MAX_CLIENT_BATCH}")
        self._untruncated(doc, [query] * len(texts), texts)
        self._raw, self._return, self._texts = _flag(doc, "raw_scores"), _flag(doc, "return_text"), texts
        if self._raw and reranker.logits is None:
            raise TEIError(f"model {self.name!r} answers no raw logits: raw_scores must be false")
        self.inputs = {
            reranker.query: np.array([query] * len(texts), dtype=object),
            reranker.document: np.array(texts, dtype=object),
        }
        self.outputs = (reranker.logits if self._raw else SCORE, TOKENS)  # type: ignore[assignment]

    def body(self, outputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        scores = np.asarray(outputs[self.outputs[0]], dtype=np.float64).reshape(-1)
        order = np.argsort(scores, kind="stable")[::-1]  # TEI's: ascending then reversed, so ties put the later first
        results: list[dict[str, Any]] = []
        for i in order.tolist():
            result: dict[str, Any] = {"index": i, "score": float(scores[i])}
            if self._return:
                result["text"] = self._texts[i]
            results.append(result)
        return results


class PredictRequest(TEIRequest):
    """``POST /predict``: a text or a batch of them in; each text's labels with their scores, best first. Where the
    body has ``parameters`` (the Hugging Face Inference API's shape, which ``InferenceClient.text_classification``
    posts), its ``top_k`` and ``function_to_apply: none`` are honoured and a single text answers nested too."""

    __slots__ = ("_single", "_raw", "_top_k")

    def read(self, doc: dict[str, Any]) -> None:
        classifier = self._routes.classifiers[self.name]
        value = doc.get("inputs", _MISSING)
        if value == []:
            raise _empty("inputs")
        if isinstance(value, str):
            rows: list[Any] = [value]
            self._single = True
        elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            rows, self._single = [value], True  # TEI reads two strings as one pair
        elif isinstance(value, list):
            rows, self._single = value, False
        else:
            raise TEIError("inputs must be a text, a pair of texts, or a list of texts or of [text] or pairs")
        texts: list[str] = []
        for i, row in enumerate(rows):
            if isinstance(row, list) and len(row) == 1:
                row = row[0]
            if isinstance(row, list) and len(row) == 2:
                raise TEIError(f"inputs[{i}] is a pair: classifier {self.name!r} reads one text a row")
            if not isinstance(row, str) or not row:
                raise TEIError(f"inputs[{i}] must be a non-empty text")
            texts.append(row)
        if len(texts) > MAX_CLIENT_BATCH:
            raise TEIError(f"batch size {len(texts)} > maximum allowed batch size {MAX_CLIENT_BATCH}")
        self._untruncated(doc, texts)
        self._raw = _flag(doc, "raw_scores")
        self._top_k: int | None = None
        parameters = doc.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise TEIError("parameters must be an object")
            self._single = False  # the Inference API nests even one text's labels
            top_k, function = parameters.get("top_k"), parameters.get("function_to_apply")
            if top_k is not None and (type(top_k) is not int or top_k < 1):
                raise TEIError(f"parameters.top_k must be a positive integer, got {top_k!r}")
            if function not in (None, "none", "softmax", "sigmoid"):
                raise TEIError(f"parameters.function_to_apply must be none, softmax or sigmoid, got {function!r}")
            self._top_k, self._raw = top_k, self._raw or function == "none"
        if self._raw and classifier.logits is None:
            raise TEIError(f"model {self.name!r} answers no raw logits: raw_scores must be false")
        self.inputs = {classifier.text: np.array(texts, dtype=object)}
        outputs = [classifier.labels_output, classifier.scores_output, TOKENS]
        self.outputs = (*outputs, classifier.logits) if self._raw else tuple(outputs)  # type: ignore[arg-type]

    def body(self, outputs: dict[str, np.ndarray[Any, Any]]) -> Any:
        classifier = self._routes.classifiers[self.name]
        labels = outputs[classifier.labels_output]
        scores = outputs[classifier.scores_output]
        index = self._routes.label_index[self.name]
        rows: list[list[dict[str, Any]]] = []
        for row in range(len(labels)):
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in labels[row].tolist()]
            if self._raw:  # the activation keeps the order: the same labels, their logits
                logits = outputs[classifier.logits]  # type: ignore[index]
                values = [float(logits[row, index[n]]) for n in names]
            else:
                values = [float(s) for s in scores[row].tolist()]
            found = [{"score": v, "label": n} for v, n in zip(values, names, strict=True)]
            rows.append(found[: self._top_k] if self._top_k is not None else found)
        return rows[0] if self._single else rows


_KINDS = {"embedding": EmbedRequest, "reranker": RerankRequest, "classifier": PredictRequest}
_ROUTES = {"embedding": "/embed", "reranker": "/rerank", "classifier": "/predict"}


class TEIRoutes:
    """The TEI routes over one data plane: the pipelines of each kind, the server's own, the requests, the answers."""

    def __init__(self, inference: InferenceRoute) -> None:
        self.inference = inference
        self.plane = inference.plane
        self.limit = inference.limit
        manifest = self.plane.service.registry.manifest
        self.manifest = manifest
        self.embedders: dict[str, Embedder] = embedders(manifest)
        self.rerankers: dict[str, Reranker] = rerankers(manifest)
        self.classifiers: dict[str, Classifier] = classifiers(manifest)
        self.kinds: dict[str, str] = {
            **{n: "classifier" for n in self.classifiers},
            **{n: "reranker" for n in self.rerankers},
            **{n: "embedding" for n in self.embedders},
        }
        pipelines = {p.name: p for p in manifest.pipelines}
        self.pipelines = {n: pipelines[n] for n in self.kinds}
        self.normalized = {n: (pool := _pool(p)) is not None and pool.normalize for n, p in self.pipelines.items()}
        self.max_length = {n: _tokenize(p).max_length for n, p in self.pipelines.items()}
        self.label_index = {n: {label: i for i, label in enumerate(c.labels)} for n, c in self.classifiers.items()}
        self.default = inference.tei_model or next(iter(self.embedders), None) or next(iter(self.kinds), None)
        self.recorders = {
            kind: RequestRecorder(
                "http", inference.recorder.telemetry, access_log=inference.recorder.access_log, route=r
            )
            for kind, r in _ROUTES.items()
        }
        self._tokenizers: dict[tuple[str, bool], Tokenizer] = {}

    # -- what a route serves -------------------------------------------------------------------------

    def model(self, model: str | None) -> str:
        """The pipeline a request is for: its path's ``model``, else the server's TEI model."""
        if model is None:
            if self.default is None:
                raise TEIError("this server has no embedding, reranking or classifying pipeline", 404, "NotFound")
            if self.default not in self.kinds:
                raise ConfigError(
                    f"FNSERVE_TEI_MODEL is {self.default!r}, which is no embedding, reranking or classifying pipeline "
                    f"of the manifest ({', '.join(sorted(self.kinds)) or 'none'})"
                )
            return self.default
        if model not in self.kinds:
            known = ", ".join(sorted(self.kinds)) or "none"
            raise TEIError(f"model {model!r} not found: TEI's routes serve {known}", 404, "NotFound")
        return model

    def tokenizer(self, name: str, cut: bool = False) -> Tokenizer:
        """The pipeline's tokenizer as its tokenize step loads it: cutting at its ``max_length`` (``cut``, what the
        model runs), or cutting nothing (to count a text's tokens)."""
        found = self._tokenizers.get((name, cut))
        if found is None:
            from tokenizers import Tokenizer

            step = _tokenize(self.pipelines[name])
            found = Tokenizer.from_file(str(Path(self.manifest.base_dir) / step.tokenizer))
            found.no_padding()
            if cut:
                found.enable_truncation(step.max_length)
            else:
                found.no_truncation()
            self._tokenizers[(name, cut)] = found
        return found

    def lengths(self, name: str, texts: list[Any], pairs: list[str] | None = None) -> list[int]:
        """The tokens each text (or text pair) is, special tokens included, before any cut; a text given as its
        token ids is as many as it has."""
        tokenizer = self.tokenizer(name)
        if pairs is not None:
            return [len(e) for e in tokenizer.encode_batch_fast(list(zip(texts, pairs, strict=True)))]
        prompt = _default_prompt(self.pipelines[name])
        words = [t if type(t) is not str else prompt + t for t in texts if not isinstance(t, TokenIds)]
        counted = iter(tokenizer.encode_batch_fast(words) if words else ())  # a named prompt is there already
        return [len(t) if isinstance(t, TokenIds) else len(next(counted)) for t in texts]

    # -- routes (ASGI) ---------------------------------------------------------------------------

    async def root(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``POST /``: the route of the model's kind, as TEI dispatches it."""
        await self._inferred(scope, receive, send, model, None)

    async def embed(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``POST /embed``."""
        await self._inferred(scope, receive, send, model, "embedding")

    async def rerank(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``POST /rerank``."""
        await self._inferred(scope, receive, send, model, "reranker")

    async def predict(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``POST /predict``."""
        await self._inferred(scope, receive, send, model, "classifier")

    async def tokenize(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``POST /tokenize``: each text's tokens with their ids and where in the text they are."""
        rid, found = request_headers(scope, _HEADERS)

        async def answer() -> tuple[bytes, dict[str, str]]:
            name = self.model(model)
            doc = _parse(await read_body(receive, found.get(b"content-length"), self.limit))
            value = doc.get("inputs", _MISSING)
            if value == []:
                raise _empty("inputs")
            texts = texts_of(value, "inputs", MAX_CLIENT_BATCH)
            if any(isinstance(t, TokenIds) for t in texts.tolist()):
                raise TEIError("inputs must be texts")
            prompts = dict(_tokenize(self.pipelines[name]).prompts)
            texts = prompted(texts, prompts, doc.get("prompt_name"), name)
            special = _flag(doc, "add_special_tokens", default=True)
            return orjson.dumps(self._tokens(name, texts.tolist(), special)), {}

        await respond_json(scope, send, rid, answer, error_parts)

    async def info(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``GET /info``: the model, its kind and the server's limits, as TEI's."""
        rid, _ = request_headers(scope, frozenset())

        async def answer() -> tuple[bytes, dict[str, str]]:
            return orjson.dumps(self._info(self.model(model))), {}

        await respond_json(scope, send, rid, answer, error_parts)

    async def health(self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None = None) -> None:
        """``GET /health``: 200 with no body once the model can answer, else TEI's 503."""
        rid, _ = request_headers(scope, frozenset())
        try:
            name = self.model(model)
        except FnserveError as exc:
            status, payload, headers = error_parts(exc)
            await respond(scope, send, status, payload, JSON, headers, rid)
            return
        catalog = self.plane.catalog
        ready = catalog.ready() and catalog.model_ready(name, None)
        if ready:
            await respond(scope, send, 200, b"", JSON, {}, rid)
        else:
            body = orjson.dumps({"error": f"model {name!r} is not ready", "error_type": "Unhealthy"})
            await respond(scope, send, 503, body, JSON, {}, rid)

    async def _inferred(
        self, scope: ASGIMessage, receive: Receive, send: Send, model: str | None, kind: str | None
    ) -> None:
        rid, found = request_headers(scope, _HEADERS)

        async def answer() -> tuple[bytes, dict[str, str]]:
            name = self.model(model)
            served_as = self.kinds[name]
            if kind is not None and served_as != kind:
                raise TEIError(
                    f"model {name!r} is {_A[served_as]}, not {_A[kind]}: it answers {_ROUTES[served_as]}",
                    424,
                    "Backend",
                )
            request = _KINDS[served_as](self, name, receive, found)
            served = await self.plane.serve(self.recorders[served_as], request)
            payload, _, headers = self.inference.http_response(served, found.get(b"accept-encoding"))
            return payload, headers

        await respond_json(scope, send, rid, answer, error_parts)

    def _tokens(self, name: str, texts: list[str], special: bool) -> list[list[dict[str, Any]]]:
        tokenizer = self.tokenizer(name, cut=True)
        prompt = _default_prompt(self.pipelines[name])
        texts = [t if type(t) is not str else prompt + t for t in texts]
        answered: list[list[dict[str, Any]]] = []
        for text, encoding in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=special), strict=True):
            tokens = []
            for token_id, token, mask, (start, stop) in zip(
                encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
            ):
                if mask:
                    tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
                else:
                    tokens.append(
                        {"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                    )
            answered.append(tokens)
        return answered

    def _info(self, name: str) -> dict[str, Any]:
        pipeline = self.pipelines[name]
        settings = next(m for m in self.manifest.models if m.name == pipeline.model)
        kind = self.kinds[name]
        model_type: dict[str, Any]
        if kind == "embedding":
            pool = _pool(pipeline)
            mode = pool.mode if isinstance(pool, PoolStep) else "mean"
            model_type = {"embedding": {"pooling": mode}}
        elif kind == "classifier":
            labels = self.classifiers[name].labels
            model_type = {
                "classifier": {
                    "id2label": {str(i): label for i, label in enumerate(labels)},
                    "label2id": {label: i for i, label in enumerate(labels)},
                }
            }
        else:
            model_type = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
        return {
            "model_id": name,
            "model_sha": settings.sha256,
            "model_dtype": "float32",  # what goes in and comes out; the graph's own arithmetic is its file's
            "served_model_name": name,
            "model_type": model_type,
            "max_concurrent_requests": settings.max_queue_size,  # rows its queue holds (null: bounded by wait)
            "max_input_length": self.max_length[name],
            "max_batch_tokens": settings.max_batch_tokens,
            "max_batch_requests": settings.max_batch_size,
            "max_client_batch_size": MAX_CLIENT_BATCH,
            "auto_truncate": True,
            "tokenization_workers": 1,
            "version": __version__,
            "sha": None,
            "docker_label": "fnserve",
        }


_A = {"embedding": "an embedding model", "reranker": "a reranker", "classifier": "a classifier"}


def _tokenize(pipeline: PipelineSettings) -> TokenizeStep:
    step = pipeline.pre[0]
    assert isinstance(step, TokenizeStep), "every pipeline TEI serves tokenizes first"
    return step


def _pool(pipeline: PipelineSettings) -> MeanPoolStep | PoolStep | None:
    last = pipeline.post[-1] if pipeline.post else None
    return last if isinstance(last, MeanPoolStep | PoolStep) else None


def _default_prompt(pipeline: PipelineSettings) -> str:
    step = _tokenize(pipeline)
    return step.prompts[step.default_prompt] if step.default_prompt is not None else ""
