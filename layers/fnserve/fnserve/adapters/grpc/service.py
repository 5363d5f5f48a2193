"""``inference.GRPCInferenceService`` over the data plane: what the HTTP routes do, in gRPC's terms.

Each RPC translates its message to a :class:`~fnserve.core.serving.dataplane.DataPlane` call (the
same validation, cache, adaptive batching, cascades and worker pool as HTTP) and the answer
back; an error becomes the gRPC status of its HTTP status (:data:`STATUS`), with the same
message. A client's deadline bounds the call: an inference still waiting (in the batcher's
queue, for a worker) when it passes is dropped, and the status is DEADLINE_EXCEEDED. The
request id (the caller's ``x-request-id`` metadata, else a new one) and the stage timings
go back as trailing metadata (``x-request-id``, ``server-timing``) and into the access line.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format

from fnserve import __version__
from fnserve.adapters.grpc import codec
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.core.errors import BadRequest, FnserveError, grpc_code
from fnserve.core.serving.dataplane import Answer, DataPlane
from fnserve.observability import tracing
from fnserve.observability.envelope import EXTENSIONS, NoTelemetry, RequestRecorder, Telemetry
from fnserve.observability.logs import request_keys
from fnserve.observability.request_meta import new_request_id, server_timing

Context = grpc.aio.ServicerContext[Any, Any]


def status_of(error: FnserveError) -> grpc.StatusCode:
    """The gRPC status an fnserve error is answered with (:func:`fnserve.core.errors.grpc_code`)."""
    return grpc.StatusCode[grpc_code(error.status_code)]


SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name  # "inference.GRPCInferenceService"


class InferenceServicer:
    """The OIP gRPC service of one data plane; ``access_log``: one line per inference, as over HTTP."""

    def __init__(self, plane: DataPlane, *, access_log: bool = True, telemetry: Telemetry | None = None) -> None:
        self.plane = plane
        self.recorder = RequestRecorder("grpc", telemetry or NoTelemetry(), access_log=access_log)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.catalog.ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="fnserve", version=__version__, extensions=EXTENSIONS)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> Any:
        try:
            ready = self.plane.catalog.model_ready(request.name, request.version or None)
        except FnserveError as exc:
            await context.abort(status_of(exc), exc.message)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> Any:
        try:
            meta = self.plane.catalog.metadata(request.name, request.version or None)
        except FnserveError as exc:
            await context.abort(status_of(exc), exc.message)
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for spec in meta["inputs"]:
            response.inputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        for spec in meta["outputs"]:
            response.outputs.add(name=spec["name"], datatype=spec["datatype"], shape=spec["shape"])
        return response

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> Any:
        try:
            config = self.plane.catalog.config(request.name, request.version or None)
        except FnserveError as exc:
            await context.abort(status_of(exc), exc.message)
        return pb.ModelConfigResponse(config=json_format.ParseDict(config, pb.ModelConfig()))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> Any:
        try:
            stats = self.plane.catalog.model_statistics(request.name or None, request.version or None)
        except FnserveError as exc:
            await context.abort(status_of(exc), exc.message)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def ModelInfer(self, request: codec.ParsedRequest, context: Context) -> Any:
        rid, traceparent = _request_metadata(context)
        request_keys(request_id=rid)
        try:
            response, _, timings = await self.plane.serve(
                self.recorder, GrpcCall(request, traceparent, context.time_remaining())
            )
        except FnserveError as exc:
            context.set_trailing_metadata((("x-request-id", rid),))
            await context.abort(status_of(exc), exc.message)
        context.set_trailing_metadata((("x-request-id", rid), ("server-timing", server_timing(timings))))
        return response


class GrpcCall:
    """A ModelInfer call as the data plane takes it: gRPC has read and parsed its message already; its deadline is
    known before it is decoded; its answer is serialised by :func:`codec.encode_response`."""

    __slots__ = ("name", "version", "traceparent", "deadline", "_parsed", "_decoded")

    def __init__(self, parsed: codec.ParsedRequest, traceparent: str | None, deadline: float | None) -> None:
        self.name: str = parsed.message.model_name
        self.version: str | None = parsed.message.model_version or None
        self.traceparent = traceparent
        self.deadline = deadline
        self._parsed = parsed
        self._decoded: codec.GrpcRequest | None = None

    async def decoded(self) -> codec.GrpcRequest:
        if self._parsed.error is not None:
            raise BadRequest(self._parsed.error)
        self._decoded = codec.decode_request(self._parsed.message, self._parsed.raw)
        return self._decoded

    def encode(self, answer: Answer) -> bytes:
        assert self._decoded is not None, "encoded before it was decoded"
        message = self._parsed.message
        return codec.encode_response(
            answer.name, answer.version, answer.outputs, message.id, answer.parameters, self._decoded.raw_outputs
        )


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
        "ModelConfig": (servicer.ModelConfig, pb.ModelConfigRequest, pb.ModelConfigResponse),
        "ModelStatistics": (servicer.ModelStatistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
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
