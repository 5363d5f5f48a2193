"""The HTTP API: Open Inference Protocol V2, shared by Lambda (Mangum) and the server (uvicorn).

Every route translates HTTP to a :class:`~fnserve.core.dataplane.DataPlane` call and its
answer back to HTTP (V2 JSON or Triton's binary tensor extension, Server-Timing, the access
log line and the telemetry record); none decides anything about inference.

Inference requests take a shorter road than the other routes: :class:`V2App` answers them
as plain ASGI, before Starlette's middleware stack, router and FastAPI's dependency solving
(~60 µs a request, more than the digits model's own run), with the same request id,
errors, headers, log line and metrics as the FastAPI route. The FastAPI app
(:mod:`~fnserve.adapters.http.routes`: health, metadata, results, the OpenAPI document,
inference under a ``root_path``) is built when a request first needs it, so a Lambda
container whose first request is an inference answers it without importing FastAPI.
"""

from __future__ import annotations

import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fnserve import tracing
from fnserve.adapters import logs
from fnserve.adapters.http.wire import error_body, request_id, server_timing
from fnserve.adapters.logs import logger
from fnserve.core.dataplane import Answer, DataPlane
from fnserve.core.errors import BadRequest, FnserveError, PayloadTooLarge
from fnserve.core.tensors import JSON_HEADER, InferenceRequest, decode_request, encode_response
from fnserve.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

ASGIMessage = MutableMapping[str, Any]  # as Starlette and Mangum type them
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]

EXTENSIONS = ["binary_tensor_data"]
JSON = "application/json"
BINARY = "application/octet-stream"


class Telemetry(Protocol):
    """Where per-request figures go (EMF metrics in Lambda, Prometheus in the server, nothing by default)."""

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None: ...


class Companion(Protocol):
    """A server that lives as long as the app, on its event loop (the gRPC server beside HTTP)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class NoTelemetry:
    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None:
        return None


def create_app(
    plane: DataPlane,
    settings: Settings | None = None,
    telemetry: Telemetry | None = None,
    *,
    on_shutdown: Callable[[], None] | None = None,
    companions: Sequence[Companion] = (),
    metrics: Callable[[], bytes] | None = None,
) -> V2App:
    """The ASGI application serving ``plane``; ``companions`` start with the server and stop first when it
    stops, then the batchers, then ``on_shutdown`` runs; ``metrics`` renders ``GET /metrics`` (Prometheus)."""
    settings = settings or Settings()
    logger.setLevel(settings.log_level)
    return V2App(InferenceRoute(plane, settings, telemetry or NoTelemetry()), on_shutdown, companions, metrics)


class V2App:
    """The V2 API over ASGI: ``POST /v2/models/{name}[/versions/{v}]/infer`` answered here, the rest by FastAPI."""

    def __init__(
        self,
        inference: InferenceRoute,
        on_shutdown: Callable[[], None] | None = None,
        companions: Sequence[Companion] = (),
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.inference = inference
        self.on_shutdown = on_shutdown
        self.companions = tuple(companions)
        self.metrics = metrics
        self.state = types.SimpleNamespace()  # what the process keeps beside the app (the server's pool)
        self._fastapi: FastAPI | None = None

    def fastapi(self) -> FastAPI:
        """The FastAPI app of the other routes, built on first use (or ahead, by a server at start)."""
        if self._fastapi is None:
            from fnserve.adapters.http import routes

            self._fastapi = routes.build(self.inference, self.on_shutdown, self.companions, self.metrics)
        return self._fastapi

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            parts = scope["path"].split("/")
            # ["", "v2", "models", name, "infer"] or [..., name, "versions", version, "infer"]
            if parts[-1] == "infer" and parts[1:3] == ["v2", "models"] and all(parts[3:-1]):
                if len(parts) == 5:
                    await self.inference.infer_asgi(scope, receive, send, parts[3], None)
                    return
                if len(parts) == 7 and parts[4] == "versions":
                    await self.inference.infer_asgi(scope, receive, send, parts[3], parts[5])
                    return
        await (self._fastapi or self.fastapi())(scope, receive, send)


class InferenceRoute:
    """The inference route's work, whichever road a request took: decode, infer, encode, log, record."""

    def __init__(self, plane: DataPlane, settings: Settings, telemetry: Telemetry) -> None:
        self.plane = plane
        self.telemetry = telemetry
        self.limit = settings.max_request_bytes
        self.access_log = settings.access_log
        self.max_wait = settings.max_wait_seconds
        self.default_model = settings.default_model

    async def infer_asgi(
        self, scope: ASGIMessage, receive: Receive, send: Send, name: str, version: str | None
    ) -> None:
        """One inference over ASGI, with what the FastAPI app's ``RequestContext`` and error handlers add."""
        rid = request_id(scope)
        logger.thread_safe_append_keys(request_id=rid)
        declared = json_length = traceparent = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value.decode("latin-1")
            elif key == b"inference-header-content-length":
                json_length = value.decode("latin-1")
            elif key == b"traceparent":
                traceparent = value.decode("latin-1")
        headers: dict[str, str]
        try:
            payload, media_type, headers = await self.answer(
                name, version, read_body(_asgi_body(receive), declared, self.limit), json_length, traceparent
            )
            status = 200
        except FnserveError as exc:
            status, payload, media_type = exc.status_code, error_body(exc.message), JSON
            headers = {"retry-after": str(exc.retry_after)} if exc.retry_after is not None else {}
        except _Disconnected:
            return  # nobody to answer
        except Exception:
            logger.exception("unhandled error", extra={"path": scope.get("path")})
            status, payload, media_type, headers = 500, error_body("internal server error"), JSON, {}
        raw = [
            (b"content-length", str(len(payload)).encode()),
            (b"content-type", media_type.encode()),
            *((k.encode(), v.encode("latin-1")) for k, v in headers.items()),
            (b"x-request-id", rid.encode("latin-1")),
        ]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload})

    async def answer(
        self,
        name: str,
        version: str | None,
        body: Awaitable[bytes],
        json_length: str | None,
        traceparent: str | None = None,
    ) -> tuple[bytes, str, dict[str, str]]:
        """One V2 inference (JSON, or the binary tensor extension): (payload, media type, headers)."""
        return await self.serve(
            name, version, body, lambda raw: decode_request(raw, _json_length(json_length)), encode_v2, traceparent
        )

    async def serve(
        self,
        name: str,
        version: str | None,
        body: Awaitable[bytes],
        decode: Callable[[bytes], InferenceRequest],
        encode: Encoder,
        traceparent: str | None = None,
    ) -> tuple[bytes, str, dict[str, str]]:
        """One inference, whatever carried it and however its body is written: decoded, inferred, encoded, timed,
        logged and recorded; a refusal is logged, recorded, raised.

        Traced (when tracing is on) in the caller's trace when ``traceparent`` says which."""
        span = tracing.start_request(name, "http", traceparent)
        try:
            t0 = time.perf_counter()
            decoded = decode(await body)
            t1 = time.perf_counter()
            answer = await self.plane.infer(name, decoded.inputs, version=version, outputs=decoded.outputs)
            t2 = time.perf_counter()
            payload, media_type, encoded = encode(answer, decoded)
            t3 = time.perf_counter()
        except FnserveError as exc:
            if self.access_log:
                logs.access("inference refused", {"model": name, "status": exc.status_code, "error": exc.message})
            self.telemetry.record(name, exc.status_code, {}, "off")
            if span is not None:
                span.end(exc.status_code, error=exc.message)
            raise
        except BaseException as exc:
            if span is not None:
                span.end(500, error=type(exc).__name__)
            raise
        timings = {
            "decode": round((t1 - t0) * 1e3, 3),
            **answer.timings,
            "encode": round((t3 - t2) * 1e3, 3),
        }
        headers = {"server-timing": server_timing(timings, answer.device), **encoded}
        if answer.cache != "off":
            headers["x-fnserve-cache"] = answer.cache
        if self.access_log:
            logs.access(
                "inference",
                {"model": name, "version": answer.version, "status": 200, "cache": answer.cache, **timings}
                | ({"device": answer.device} if answer.device else {}),
            )
        self.telemetry.record(name, 200, timings, answer.cache, answer.version)
        if span is not None:
            span.end(200, timings)
        return payload, media_type, headers


# How an answer is written: (payload, media type, headers of its own).
Encoder = Callable[[Answer, InferenceRequest], tuple[bytes, str, dict[str, str]]]


def encode_v2(answer: Answer, request: InferenceRequest) -> tuple[bytes, str, dict[str, str]]:
    """A V2 answer: JSON, or JSON then binary tensors (with the JSON part's length in a header)."""
    payload, head_length = encode_response(answer.name, answer.version, answer.outputs, request, answer.parameters)
    if head_length is None:
        return payload, JSON, {}
    return payload, BINARY, {JSON_HEADER: str(head_length)}


class _Disconnected(Exception):
    """The client went away before its request body arrived."""


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit")
    parts = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _asgi_body(receive: Receive) -> AsyncIterator[bytes]:
    """The request body's chunks, as Starlette's ``Request.stream`` gives them."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected()
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def _json_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"Inference-Header-Content-Length must be an integer, got {value!r}") from None
