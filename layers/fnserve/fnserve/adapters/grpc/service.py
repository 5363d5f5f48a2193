"""``inference.GRPCInferenceService`` over the data plane: what the HTTP routes do, in gRPC's terms.

Each RPC translates its message to a :class:`~fnserve.core.dataplane.DataPlane` call (the
same validation, cache, adaptive batching, cascades and worker pool as HTTP) and the answer
back; an error becomes the gRPC status of its HTTP status (:data:`STATUS`), with the same
message. A client's deadline bounds the call: an inference still waiting (in the batcher's
queue, for a worker) when it passes is dropped, and the status is DEADLINE_EXCEEDED. The
request id (the caller's ``x-request-id`` metadata, else a new one) and the stage timings
go back as trailing metadata (``x-request-id``, ``server-timing``) and into the access line.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from fnserve import __version__, tracing
from fnserve.adapters import logs
from fnserve.adapters.grpc import codec
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.adapters.http.app import EXTENSIONS, NoTelemetry, Telemetry
from fnserve.adapters.http.wire import new_request_id, server_timing
from fnserve.adapters.logs import logger
from fnserve.core.dataplane import DataPlane
from fnserve.core.errors import BadRequest, FnserveError

Context = grpc.aio.ServicerContext[Any, Any]

# HTTP status of an fnserve error -> gRPC status. What a client sent wrong is never UNKNOWN or INTERNAL.
STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_of(error: FnserveError) -> grpc.StatusCode:
    """The gRPC status of an fnserve error (a server-side fault, 500 or 502, is INTERNAL)."""
    return STATUS.get(error.status_code, grpc.StatusCode.INTERNAL)


SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name  # "inference.GRPCInferenceService"


class InferenceServicer:
    """The OIP gRPC service of one data plane; ``access_log``: one line per inference, as over HTTP."""

    def __init__(self, plane: DataPlane, *, access_log: bool = True, telemetry: Telemetry | None = None) -> None:
        self.plane = plane
        self.access_log = access_log
        self.telemetry = telemetry or NoTelemetry()

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="fnserve", version=__version__, extensions=EXTENSIONS)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> Any:
        try:
            ready = self.plane.model_ready(request.name, request.version or None)
        except FnserveError as exc:
            await context.abort(status_of(exc), exc.message)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> Any:
        try:
            meta = self.plane.metadata(request.name, request.version or None)
        except FnserveError as exc:
            await context.abort(status_of(exc), exc.message)
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for spec in meta["inputs"]:
            response.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        for spec in meta["outputs"]:
            response.outputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        return response

    async def ModelInfer(self, request: codec.ParsedRequest, context: Context) -> Any:
        rid, traceparent = _request_metadata(context)
        name = request.message.model_name
        logger.thread_safe_append_keys(request_id=rid)
        span = tracing.start_request(name, "grpc", traceparent)
        try:
            response, version, cache, timings = await self._infer(request, context.time_remaining())
        except FnserveError as exc:
            self._refused(context, rid, name, exc.status_code, exc.message, span)
            await context.abort(status_of(exc), exc.message)
        except TimeoutError:
            message = "the deadline passed before the inference finished"
            self._refused(context, rid, name, 504, message, span)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        except Exception:
            logger.exception("unhandled error", extra={"model": name, "transport": "grpc"})
            self._refused(context, rid, name, 500, "internal server error", span)
            await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
        except BaseException:  # cancelled: the client went away, or its deadline passed
            if span is not None:
                span.end(499, error="cancelled")
            raise
        context.set_trailing_metadata((("x-request-id", rid), ("server-timing", server_timing(timings))))
        if self.access_log:
            logs.access(
                "inference",
                {"model": name, "version": version, "status": 200, "transport": "grpc", **timings},
            )
        self.telemetry.record(name, 200, timings, cache, version)
        if span is not None:
            span.end(200, timings)
        return response

    async def _infer(
        self, parsed: codec.ParsedRequest, remaining: float | None
    ) -> tuple[bytes, str, str, dict[str, float]]:
        """The serialised response, the version that answered, the cache state, and the stage timings."""
        t0 = time.perf_counter()
        if parsed.error is not None:
            raise BadRequest(parsed.error)
        request = parsed.message
        decoded = codec.decode_request(request, parsed.raw)
        t1 = time.perf_counter()
        call = self.plane.infer(
            request.model_name, decoded.inputs, version=request.model_version or None, outputs=decoded.outputs
        )
        if remaining is None:
            answer = await call
        else:
            remaining -= t1 - t0
            if remaining <= 0:
                call.close()  # never started
                raise TimeoutError()
            answer = await asyncio.wait_for(call, remaining)
        t2 = time.perf_counter()
        response = codec.encode_response(
            answer.name, answer.version, answer.outputs, request.id, answer.parameters, decoded.raw_outputs
        )
        t3 = time.perf_counter()
        timings = {"decode": round((t1 - t0) * 1e3, 3), **answer.timings, "encode": round((t3 - t2) * 1e3, 3)}
        return response, answer.version, answer.cache, timings

    def _refused(
        self, context: Context, rid: str, name: str, status: int, message: str, span: tracing.RequestSpan | None
    ) -> None:
        """A refusal's trailing metadata, access line, record and span; ``status`` is its HTTP status, as in metrics."""
        context.set_trailing_metadata((("x-request-id", rid),))
        if self.access_log and status != 500:
            fields = {"model": name, "status": status, "error": message, "transport": "grpc"}
            logs.access("inference refused", fields)
        self.telemetry.record(name, status, {}, "off")
        if span is not None:
            span.end(status, error=message)


def method_handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """The service's methods with their (de)serializers: protobuf's, but ModelInfer's own (raw contents as
    views of the received bytes in, a response serialised by :func:`codec.encode_response` out)."""
    unary = grpc.unary_unary_rpc_method_handler
    messages: dict[str, tuple[Any, Any, Any]] = {
        "ServerLive": (servicer.ServerLive, pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": (servicer.ServerReady, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelReady": (servicer.ModelReady, pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ServerMetadata": (servicer.ServerMetadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ModelMetadata": (servicer.ModelMetadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    }
    handlers = {
        name: unary(method, request.FromString, response.SerializeToString)
        for name, (method, request, response) in messages.items()
    }
    handlers["ModelInfer"] = unary(servicer.ModelInfer, codec.parse_request, bytes)
    return handlers


def _request_metadata(context: Context) -> tuple[str, str | None]:
    """The request id (the caller's ``x-request-id``, else a new one) and the caller's ``traceparent``."""
    rid = traceparent = None
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and value:
            rid = str(value)[:128]
        elif key == tracing.TRACEPARENT:
            traceparent = str(value)
    return rid or new_request_id(), traceparent
