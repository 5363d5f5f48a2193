"""The HTTP API: Open Inference Protocol V2 over FastAPI, shared by Lambda (Mangum) and the server.

Routes translate HTTP to :class:`InferenceService` calls and back; they hold no inference logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Annotated, Any, Protocol, TypeVar

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fnserve import __version__
from fnserve.adapters import openapi
from fnserve.adapters.logs import logger
from fnserve.core.batching import AdaptiveBatcher
from fnserve.core.cascade import CascadeRunner
from fnserve.core.errors import BadRequest, FnserveError, ModelNotFound, PayloadTooLarge
from fnserve.core.jobs import job_key
from fnserve.core.service import InferenceService, Prediction
from fnserve.core.settings import Settings
from fnserve.core.tensors import JSON_HEADER, decode_request, encode_response, json_tensor, unpack_arrays

T = TypeVar("T")
EXTENSIONS = ["binary_tensor_data"]
JSON = "application/json"
BINARY = "application/octet-stream"


class Telemetry(Protocol):
    """Where per-request figures go (EMF metrics in Lambda, nothing by default)."""

    def record(self, model: str, status: int, timings: dict[str, float], cache: str) -> None: ...


class NoTelemetry:
    def record(self, model: str, status: int, timings: dict[str, float], cache: str) -> None:
        return None


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type=JSON,
        headers=headers,
    )


def error_response(message: str, status_code: int, headers: Mapping[str, str] | None = None) -> Response:
    return json_response({"error": message}, status_code, headers)


def request_id(scope: Scope) -> str:
    """The caller's X-Request-Id, else the Lambda request id, else a new one."""
    for key, value in scope.get("headers", ()):
        if key == b"x-request-id" and value:
            return bytes(value[:128]).decode("latin-1")
    rid = getattr(scope.get("aws.context"), "aws_request_id", None)
    return str(rid) if rid else f"{_ID_PREFIX}-{next(_ID_COUNTER):x}"


# Request ids made here: unique per process (random prefix) and cheap (a counter, no uuid4 per request).
_ID_PREFIX = uuid.uuid4().hex[:12]
_ID_COUNTER = itertools.count(1)


def new_id_prefix() -> None:
    """A new prefix for the request ids made here (after a SnapStart restore)."""
    global _ID_PREFIX
    _ID_PREFIX = uuid.uuid4().hex[:12]


class RequestContext:
    """Pure ASGI middleware: request id in every log line and in the response; no 500 leaks details.

    (Starlette's BaseHTTPMiddleware would cost a task and a stream per request.)
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        logger.thread_safe_append_keys(request_id=rid)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error", extra={"path": scope.get("path")})
            if started:
                raise
            await error_response("internal server error", 500)(scope, receive, send_with_id)


class ResultReader(Protocol):
    """Stored results by key (the DynamoDB result store in AWS)."""

    def get(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]: ...


def create_app(
    service: InferenceService,
    settings: Settings | None = None,
    telemetry: Telemetry | None = None,
    *,
    cascades: CascadeRunner | None = None,
    results: ResultReader | None = None,
    batchers: Mapping[str, AdaptiveBatcher] | None = None,
    offload: bool = False,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The FastAPI application serving ``service``, its cascades, and stored results.

    ``offload``: inference waits in a thread, not on the event loop (a server whose models are
    in worker processes); otherwise it runs inline, which is fastest for in-process models.
    ``on_shutdown`` runs when the server stops (ASGI lifespan), after the batchers have stopped.
    """
    settings = settings or Settings()
    logger.setLevel(settings.log_level)
    telemetry = telemetry or NoTelemetry()
    limit = settings.max_request_bytes
    access_log = settings.access_log

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for batcher in (batchers or {}).values():
            await batcher.close()
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(
        title="fnserve",
        version=__version__,
        description="Open Inference Protocol V2 (REST) with Triton's binary tensor extension.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.add_middleware(RequestContext)

    async def run_inference(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` in a thread when the models are in worker processes, else inline on the loop."""
        return await run_in_threadpool(fn, *args, **kwargs) if offload else fn(*args, **kwargs)

    # The hot route first: Starlette tries routes in order.
    @app.post("/v2/models/{name}/infer", tags=["inference"], **openapi.infer(versioned=False))
    @app.post("/v2/models/{name}/versions/{version}/infer", tags=["inference"], **openapi.infer(versioned=True))
    async def infer(request: Request) -> Response:
        # Path parameters read directly: FastAPI's per-parameter validation costs more than the model.
        name: str = request.path_params["name"]
        version: str | None = request.path_params.get("version")
        timings: dict[str, float] = {}
        queued = 0.0  # ms spent waiting for a batch
        status = 200
        try:
            t0 = time.perf_counter()
            body = await _read_body(request, limit)
            json_length = _json_length(request)
            decoded = decode_request(body, json_length)
            t1 = time.perf_counter()
            params: dict[str, Any] = {}
            if cascades is not None and name in cascades.cascades:
                if version is not None:
                    raise ModelNotFound(f"cascade {name!r} has no versions")
                answer = await run_inference(cascades.infer, name, decoded.inputs, decoded.outputs)
                prediction = answer.prediction
                params |= {"answered_by": prediction.model, "followup_status": answer.status}
                if answer.followup_id is not None:
                    params |= {"followup_id": answer.followup_id, "followup_url": f"/v2/results/{answer.followup_id}"}
                served = name
            elif batchers and version is None and name in batchers:
                # Checked alone first: a bad request must not fail the batch it would have joined.
                feed = service.validate(name, decoded.inputs)
                names = service.output_names(name, decoded.outputs)
                everything, waited = await batchers[name].predict(feed)
                loaded = service.registry.get(name)
                prediction = Prediction({o: everything[o] for o in names}, loaded.name, loaded.version, "off")
                queued = round(waited * 1e3, 3)
                served = prediction.model
            else:
                prediction = await run_inference(
                    service.infer, name, decoded.inputs, version=version, outputs=decoded.outputs
                )
                served = prediction.model
            t2 = time.perf_counter()
            cache = prediction.cache
            if cache != "off":
                params["cache"] = cache
            payload, head_length = encode_response(served, prediction.version, prediction.outputs, decoded, params)
            t3 = time.perf_counter()
        except FnserveError as exc:
            status = exc.status_code
            if access_log:
                logger.info("inference refused", extra={"model": name, "status": status, "error": exc.message})
            telemetry.record(name, status, timings, "off")
            raise
        timings = {
            "decode": round((t1 - t0) * 1e3, 3),
            **({"queue": queued} if queued else {}),
            "infer": round((t2 - t1) * 1e3 - queued, 3),
            "encode": round((t3 - t2) * 1e3, 3),
        }
        headers = {"server-timing": ", ".join(f"{k};dur={v}" for k, v in timings.items())}
        if cache != "off":
            headers["x-fnserve-cache"] = cache
        if head_length is not None:
            headers[JSON_HEADER] = str(head_length)
        if access_log:
            extra = {"model": name, "version": prediction.version, "status": status, "cache": cache, **timings}
            logger.info("inference", extra=extra)
        telemetry.record(name, status, timings, cache)
        return Response(payload, media_type=BINARY if head_length is not None else JSON, headers=headers)

    @app.exception_handler(FnserveError)
    async def _fnserve_error(request: Request, exc: FnserveError) -> Response:
        return error_response(exc.message, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return error_response(problems, 400)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(str(exc.detail), exc.status_code, exc.headers)

    @app.get("/v2/health/live", tags=["health"], responses=openapi.LIVE)
    async def live() -> Response:
        return json_response({"live": True})

    @app.get("/v2/health/ready", tags=["health"], responses=openapi.READY)
    async def ready() -> Response:
        is_ready = service.ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    @app.get("/v2", tags=["metadata"], responses=openapi.SERVER_METADATA)
    @app.get("/v2/", include_in_schema=False)
    async def server_metadata() -> Response:
        return json_response({"name": "fnserve", "version": __version__, "extensions": EXTENSIONS})

    @app.get("/v2/models/{name}", tags=["metadata"], responses=openapi.MODEL_METADATA)
    @app.get("/v2/models/{name}/versions/{version}", tags=["metadata"], responses=openapi.MODEL_METADATA)
    async def model_metadata(name: str, version: str | None = None) -> Response:
        if cascades is not None and name in cascades.cascades and version is None:
            cascade = cascades.cascades[name]
            meta = service.model_metadata(cascade.fast, cascade.fast_version)
            return json_response({**meta, "name": name, "versions": [], "platform": "fnserve_cascade"})
        return json_response(service.model_metadata(name, version))

    @app.get("/v2/models/{name}/ready", tags=["health"], responses=openapi.MODEL_READY)
    @app.get("/v2/models/{name}/versions/{version}/ready", tags=["health"], responses=openapi.MODEL_READY)
    async def model_ready(name: str, version: str | None = None) -> Response:
        if cascades is not None and name in cascades.cascades and version is None:
            cascade = cascades.cascades[name]
            is_ready = service.model_ready(cascade.fast, cascade.fast_version) and service.model_ready(
                cascade.slow, cascade.slow_version
            )
        else:
            is_ready = service.model_ready(name, version)
        return json_response({"name": name, "ready": is_ready}, 200 if is_ready else 503)

    max_wait = settings.max_wait_seconds

    @app.get("/v2/results/{result_id}", tags=["results"], responses=openapi.RESULT)
    async def result(
        result_id: str,
        wait: Annotated[float, Query(ge=0, le=3600, description="Seconds to long-poll for the result.")] = 0.0,
    ) -> Response:
        """A stored result (cascade follow-up or batch job); ``wait`` long-polls for it (at most max_wait_seconds)."""
        if results is None:
            raise ModelNotFound("results are not stored here (no results table is configured)")
        claim = cascades.ids.parse(result_id) if cascades is not None else None
        cascade = cascades.cascades.get(claim.cascade) if cascades is not None and claim is not None else None
        if claim is not None and cascade is not None and claim.status == "skipped":
            return json_response({"id": result_id, "status": "skipped", "model_name": cascade.fast})
        key = job_key(result_id)
        deadline = time.monotonic() + min(wait, max_wait)
        delay = 0.05
        while True:
            item = (await run_in_threadpool(results.get, [key])).get(key)
            if item is not None:
                return json_response(_result_document(result_id, item))
            if claim is None or cascade is None or time.time() - claim.created > cascade.result_ttl_seconds:
                raise ModelNotFound(f"result {result_id!r} not found")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return json_response({"id": result_id, "status": "pending", "model_name": cascade.slow})
            # Back off between reads: a 20 s wait costs about 25 reads, not hundreds.
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)

    return app


def _result_document(result_id: str, item: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": result_id, "status": item.get("status"), "model_name": item.get("model_name")}
    if item.get("model_version"):
        doc["model_version"] = item["model_version"]
    if item.get("status") == "done":
        doc["outputs"] = [json_tensor(name, array) for name, array in unpack_arrays(item["payload"]).items()]
    elif item.get("error"):
        doc["error"] = item["error"]
    return doc


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_length(request: Request) -> int | None:
    value = request.headers.get(JSON_HEADER)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"Inference-Header-Content-Length must be an integer, got {value!r}") from None
