"""The HTTP API: Open Inference Protocol V2 over FastAPI, shared by Lambda (Mangum) and the server.

Each route translates HTTP to a :class:`~fnserve.core.dataplane.DataPlane` call and its answer
back to HTTP (V2 JSON or Triton's binary tensor extension, Server-Timing, the access log
line and the telemetry record); it decides nothing about inference.

Inference requests take a shorter road than the other routes: :class:`V2App` answers them
as plain ASGI before Starlette's middleware stack, router and FastAPI's dependency solving
(~60 µs a request, more than the digits model's own run), with the same request id, errors,
headers, log line and metrics as the FastAPI route, which stays for the OpenAPI document
and for a mounted app (a ``root_path``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Protocol

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from fnserve import __version__
from fnserve.adapters import logs
from fnserve.adapters.http import openapi
from fnserve.adapters.http.middleware import (
    RequestContext,
    error_body,
    install_error_handlers,
    json_response,
    request_id,
)
from fnserve.adapters.logs import logger
from fnserve.core.dataplane import DataPlane
from fnserve.core.errors import BadRequest, FnserveError, PayloadTooLarge
from fnserve.core.followups import ResultState
from fnserve.core.tensors import JSON_HEADER, decode_request, encode_response, json_tensor
from fnserve.settings import Settings

EXTENSIONS = ["binary_tensor_data"]
JSON = "application/json"
BINARY = "application/octet-stream"


class Telemetry(Protocol):
    """Where per-request figures go (EMF metrics in Lambda, nothing by default)."""

    def record(self, model: str, status: int, timings: dict[str, float], cache: str) -> None: ...


class NoTelemetry:
    def record(self, model: str, status: int, timings: dict[str, float], cache: str) -> None:
        return None


def create_app(
    plane: DataPlane,
    settings: Settings | None = None,
    telemetry: Telemetry | None = None,
    *,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The FastAPI application serving ``plane``; ``on_shutdown`` runs when the server stops, after the batchers."""
    settings = settings or Settings()
    logger.setLevel(settings.log_level)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await plane.close()
        if on_shutdown is not None:
            on_shutdown()

    routes = V2Routes(plane, settings, telemetry or NoTelemetry())
    app = V2App(
        routes,
        title="fnserve",
        version=__version__,
        description="Open Inference Protocol V2 (REST) with Triton's binary tensor extension.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.add_middleware(RequestContext)
    install_error_handlers(app)
    # The hot route first: Starlette tries routes in order.
    app.post("/v2/models/{name}/infer", tags=["inference"], **openapi.infer(versioned=False))(routes.infer)
    app.post("/v2/models/{name}/versions/{version}/infer", tags=["inference"], **openapi.infer(versioned=True))(
        routes.infer
    )
    app.get("/v2/health/live", tags=["health"], responses=openapi.LIVE)(routes.live)
    app.get("/v2/health/ready", tags=["health"], responses=openapi.READY)(routes.ready)
    app.get("/v2", tags=["metadata"], responses=openapi.SERVER_METADATA)(routes.server_metadata)
    app.get("/v2/", include_in_schema=False)(routes.server_metadata)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.get(prefix, tags=["metadata"], responses=openapi.MODEL_METADATA)(routes.model_metadata)
        app.get(f"{prefix}/ready", tags=["health"], responses=openapi.MODEL_READY)(routes.model_ready)
    app.get("/v2/results/{result_id}", tags=["results"], responses=openapi.RESULT)(routes.result)
    return app


class V2App(FastAPI):
    """FastAPI, with ``POST /v2/models/{name}[/versions/{version}]/infer`` answered directly over ASGI."""

    def __init__(self, routes: V2Routes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.v2 = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            parts = scope["path"].split("/")
            # ["", "v2", "models", name, "infer"] or [..., name, "versions", version, "infer"]
            if parts[-1] == "infer" and parts[1:3] == ["v2", "models"] and all(parts[3:-1]):
                if len(parts) == 5:
                    await self.v2.infer_asgi(scope, receive, send, parts[3], None)
                    return
                if len(parts) == 7 and parts[4] == "versions":
                    await self.v2.infer_asgi(scope, receive, send, parts[3], parts[5])
                    return
        await super().__call__(scope, receive, send)


class V2Routes:
    """The routes of the V2 API over one data plane."""

    def __init__(self, plane: DataPlane, settings: Settings, telemetry: Telemetry) -> None:
        self.plane = plane
        self.telemetry = telemetry
        self.limit = settings.max_request_bytes
        self.access_log = settings.access_log
        self.max_wait = settings.max_wait_seconds

    async def infer(self, request: Request) -> Response:
        """The FastAPI route (documented in the OpenAPI schema; :class:`V2App` answers most requests first)."""
        # Path parameters read directly: FastAPI's per-parameter validation costs more than the model.
        headers = request.headers
        payload, media_type, extra = await self.answer(
            request.path_params["name"],
            request.path_params.get("version"),
            _read_body(request.stream(), headers.get("content-length"), self.limit),
            headers.get(JSON_HEADER),
        )
        return Response(payload, media_type=media_type, headers=extra)

    async def infer_asgi(self, scope: Scope, receive: Receive, send: Send, name: str, version: str | None) -> None:
        """The same inference as :meth:`infer` with what ``RequestContext`` and the error handlers add, over ASGI."""
        rid = request_id(scope)
        logger.thread_safe_append_keys(request_id=rid)
        declared = json_length = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value.decode("latin-1")
            elif key == b"inference-header-content-length":
                json_length = value.decode("latin-1")
        headers: dict[str, str]
        try:
            payload, media_type, headers = await self.answer(
                name, version, _read_body(_asgi_body(receive), declared, self.limit), json_length
            )
            status = 200
        except FnserveError as exc:
            status, payload, media_type = exc.status_code, error_body(exc.message), JSON
            headers = {"retry-after": str(exc.retry_after)} if exc.retry_after is not None else {}
        except ClientDisconnect:
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
        self, name: str, version: str | None, body: Awaitable[bytes], json_length: str | None
    ) -> tuple[bytes, str, dict[str, str]]:
        """One inference, whatever carried it: (payload, media type, headers); a refusal is logged, recorded, raised."""
        try:
            t0 = time.perf_counter()
            decoded = decode_request(await body, _json_length(json_length))
            t1 = time.perf_counter()
            answer = await self.plane.infer(name, decoded.inputs, version=version, outputs=decoded.outputs)
            t2 = time.perf_counter()
            payload, head_length = encode_response(
                answer.name, answer.version, answer.outputs, decoded, answer.parameters
            )
            t3 = time.perf_counter()
        except FnserveError as exc:
            if self.access_log:
                logs.access("inference refused", {"model": name, "status": exc.status_code, "error": exc.message})
            self.telemetry.record(name, exc.status_code, {}, "off")
            raise
        timings = {
            "decode": round((t1 - t0) * 1e3, 3),
            **answer.timings,
            "encode": round((t3 - t2) * 1e3, 3),
        }
        headers = {"server-timing": ", ".join(f"{k};dur={v}" for k, v in timings.items())}
        if answer.cache != "off":
            headers["x-fnserve-cache"] = answer.cache
        if head_length is not None:
            headers[JSON_HEADER] = str(head_length)
        if self.access_log:
            logs.access(
                "inference", {"model": name, "version": answer.version, "status": 200, "cache": answer.cache, **timings}
            )
        self.telemetry.record(name, 200, timings, answer.cache)
        return payload, BINARY if head_length is not None else JSON, headers

    async def live(self) -> Response:
        return json_response({"live": True})

    async def ready(self) -> Response:
        is_ready = self.plane.ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    async def server_metadata(self) -> Response:
        return json_response({"name": "fnserve", "version": __version__, "extensions": EXTENSIONS})

    async def model_metadata(self, name: str, version: str | None = None) -> Response:
        return json_response(self.plane.metadata(name, version))

    async def model_ready(self, name: str, version: str | None = None) -> Response:
        is_ready = self.plane.model_ready(name, version)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 503)

    async def result(
        self,
        result_id: str,
        wait: Annotated[
            float, Query(ge=0, description="Seconds to long-poll while pending; at most FNSERVE_MAX_WAIT_SECONDS.")
        ] = 0.0,
    ) -> Response:
        """A stored result (cascade follow-up or batch job); ``wait`` long-polls for it."""
        return json_response(_result_document(await self.plane.result(result_id, min(wait, self.max_wait))))


def _result_document(state: ResultState) -> dict[str, object]:
    doc: dict[str, object] = {"id": state.id, "status": state.state, "model_name": state.model}
    record = state.record
    if record is None:
        return doc
    if record.version:
        doc["model_version"] = record.version
    if record.status == "done":
        doc["outputs"] = [json_tensor(name, array) for name, array in record.outputs().items()]
    elif record.error:
        doc["error"] = record.error
    return doc


async def _read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
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
            raise ClientDisconnect()
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
