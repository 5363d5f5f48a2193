"""Cohere's rerank API over HTTP: ``POST /v1/rerank`` and ``POST /v2/rerank``, which the ``cohere`` client, LangChain's
and LlamaIndex's Cohere rerankers, Jina's shape and LiteLLM call.

A codec over the data plane the V2 routes use, as :mod:`~fnserve.adapters.http.openai` is: the body decoded into a
reranking pipeline's query and document columns (one pair a document), the answer written as Cohere's results,
best first, every error in Cohere's shape (``{"message": ...}``). Admission, deadlines, the cache, batching by
tokens, metrics, traces and the access line are the data plane's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
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
from fnserve.core.errors import FnserveError
from fnserve.core.models.manifest.loading import Manifest
from fnserve.core.models.manifest.steps import SigmoidStep, TokenizeStep
from fnserve.core.serving.dataplane import Answer
from fnserve.observability.envelope import RequestRecorder

RERANK = ("/v1/rerank", "/v2/rerank")
MAX_DOCUMENTS = 10_000  # Cohere's own hard cap on a request's documents
SCORE = "score"  # the output a reranking pipeline answers with: sigmoid of its logit, 0 to 1
_HEADERS = frozenset({b"content-length", b"traceparent", b"accept-encoding"})


@dataclass(frozen=True, slots=True)
class Reranker:
    """A pipeline served as a reranker: the inputs that take the query and each document."""

    name: str
    query: str
    document: str
    logits: str | None = None  # the raw score the sigmoid reads, where the pipeline answers it (TEI's raw_scores)


def rerankers(manifest: Manifest) -> dict[str, Reranker]:
    """Every pipeline of ``manifest`` that scores text pairs (its tokenize step reads a pair) with a ``score``."""
    found: dict[str, Reranker] = {}
    for pipeline in manifest.pipelines:
        first = pipeline.pre[0] if pipeline.pre else None
        scores = pipeline.outputs is not None and SCORE in pipeline.outputs
        if isinstance(first, TokenizeStep) and first.pair is not None and scores:
            sigmoid = next((s for s in pipeline.post if isinstance(s, SigmoidStep) and s.output == SCORE), None)
            logits = sigmoid.input if sigmoid is not None and sigmoid.input in (pipeline.outputs or ()) else None
            found[pipeline.name] = Reranker(pipeline.name, first.input, first.pair, logits)
    return found


class RerankError(FnserveError):
    """A refusal in Cohere's terms: ``{"message": ...}`` with its status (400 unless said)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message, status_code)


def error_parts(error: FnserveError) -> tuple[int, bytes, dict[str, str]]:
    status = 400 if error.status_code == 422 else error.status_code
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else {}
    return status, orjson.dumps({"message": error.message}), headers


class RerankRequest:
    """A rerank request as the data plane takes it: its body read once admitted (or before, where the server reranks
    with more than one model and the body names which: ``doc``), checked field by field; its answer Cohere's."""

    __slots__ = (
        *("name", "traceparent", "deadline", "inputs", "outputs", "timeout"),
        *("_doc", "_routes", "_version", "_receive", "_declared", "_texts", "_top_n", "_return"),
    )
    version = None

    def __init__(
        self,
        routes: RerankRoutes,
        name: str,
        doc: dict[str, Any] | None,
        receive: Receive,
        declared: str | None,
        traceparent: str | None,
        version: str,
    ) -> None:
        self._routes, self._doc, self._version = routes, doc, version
        self._receive, self._declared = receive, declared
        self.name = name
        self.traceparent = traceparent
        self.deadline: float | None = None
        self.timeout: float | None = None
        self.inputs: dict[str, np.ndarray[Any, Any]] = {}
        self.outputs: tuple[str, ...] = (SCORE,)
        self._texts: list[str] = []
        self._top_n: int | None = None
        self._return = False

    async def decoded(self) -> RerankRequest:
        doc = self._doc
        if doc is None:
            doc = _parse(await read_body(self._receive, self._declared, self._routes.limit))
        if doc.get("model") not in (None, self.name):
            raise _unknown(doc["model"], self._routes)
        query, documents = doc.get("query"), doc.get("documents")
        if not isinstance(query, str) or not query.strip():
            raise RerankError("invalid request: query must be a non-empty string")
        if not isinstance(documents, list) or not documents:
            raise RerankError("invalid request: list of documents must not be empty")
        if len(documents) > MAX_DOCUMENTS:
            raise RerankError(f"invalid request: {len(documents)} documents; at most {MAX_DOCUMENTS} a request")
        for i, document in enumerate(documents):
            text = document.get("text") if isinstance(document, dict) else document
            if not isinstance(text, str) or not text.strip():
                raise RerankError(f"invalid request: documents[{i}] must be a non-empty string or an object with text")
            self._texts.append(text)
        top_n = doc.get("top_n")
        if top_n is not None and (type(top_n) is not int or top_n < 1):
            raise RerankError(f"invalid request: top_n must be a positive integer, got {top_n!r}")
        self._top_n, self._return = top_n, bool(doc.get("return_documents"))
        reranker = self._routes.rerankers[self.name]
        self.inputs = {
            reranker.query: np.array([query] * len(self._texts), dtype=object),
            reranker.document: np.array(self._texts, dtype=object),
        }
        return self

    def encode(self, answer: Answer) -> tuple[bytes, str, dict[str, str]]:
        scores = np.asarray(answer.outputs[SCORE], dtype=np.float64).reshape(-1)
        order = np.argsort(-scores, kind="stable")  # best first; ties in the documents' order
        if self._top_n is not None:
            order = order[: self._top_n]
        results = []
        for i in order.tolist():
            result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
            if self._return:
                result["document"] = {"text": self._texts[i]}
            results.append(result)
        doc = {
            "id": str(uuid.uuid4()),
            "results": results,
            "meta": {"api_version": {"version": self._version}, "billed_units": {"search_units": 1}},
        }
        return orjson.dumps(doc), JSON, {}


class RerankRoutes:
    """The rerank routes over one data plane: which of its pipelines rerank, the requests, the answers."""

    def __init__(self, inference: InferenceRoute) -> None:
        self.inference = inference
        self.plane = inference.plane
        self.limit = inference.limit
        self.recorder = RequestRecorder(
            "http", inference.recorder.telemetry, access_log=inference.recorder.access_log, route=RERANK[0]
        )
        self.rerankers = rerankers(self.plane.service.registry.manifest)
        self.only = next(iter(self.rerankers)) if len(self.rerankers) == 1 else None

    async def rerank(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        """``POST /v1/rerank`` and ``POST /v2/rerank``."""
        rid, found = request_headers(scope, _HEADERS)
        declared = found.get(b"content-length")
        version = "2" if scope["path"].endswith("/v2/rerank") else "1"

        async def answer() -> tuple[bytes, dict[str, str]]:
            name, doc = self.only, None
            if name is None:  # the body says which model: read it first
                doc = _parse(await read_body(receive, declared, self.limit))
                name = doc.get("model")
                if not isinstance(name, str):
                    raise RerankError(f"invalid request: model is required, one of {sorted(self.rerankers)}")
                if name not in self.rerankers:
                    raise _unknown(name, self)
            request = RerankRequest(self, name, doc, receive, declared, found.get(b"traceparent"), version)
            served = await self.plane.serve(self.recorder, request)
            payload, _, headers = self.inference.http_response(served, found.get(b"accept-encoding"))
            return payload, headers

        await respond_json(scope, send, rid, answer, error_parts)


def _unknown(model: object, routes: RerankRoutes) -> RerankError:
    return RerankError(f"model {model!r} not found: it reranks with {sorted(routes.rerankers)}", 404)


def _parse(raw: bytes) -> dict[str, Any]:
    return json_object(raw, lambda message: RerankError(f"invalid request: {message}"))
