"""The gRPC server beside the HTTP one: the OIP service, health checking and reflection, one event loop.

It runs in each front process of ``fnserve serve`` (``--grpc-port``), on the loop uvicorn
runs, over the same data plane: requests from both transports share the batchers, the
cache and the worker pool. Several front processes share the port as they share the HTTP
one (SO_REUSEPORT); a single process does not set it, so a port taken by another server is
an error at start, not two servers splitting its traffic.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from fnserve.adapters.grpc.gate import KeyInterceptor
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.adapters.grpc.service import SERVICE, InferenceServicer, method_handlers
from fnserve.adapters.keys import ApiKeys
from fnserve.core.errors import ConfigError
from fnserve.core.serving.dataplane import DataPlane
from fnserve.observability.envelope import Telemetry
from fnserve.observability.logs import logger


class GrpcServer:
    """``inference.GRPCInferenceService``, ``grpc.health.v1.Health`` and reflection on ``host:port``.

    ``max_message_bytes``: the largest request accepted (larger ones get RESOURCE_EXHAUSTED from
    gRPC itself, before any parsing); responses are not bounded. ``grace_seconds``: how long calls
    in flight may finish at shutdown. ``shared_port``: other processes serve the same port
    (SO_REUSEPORT). ``keys``: the API keys a call must carry (:mod:`~fnserve.adapters.grpc.gate`).
    """

    def __init__(
        self,
        plane: DataPlane,
        host: str,
        port: int,
        *,
        max_message_bytes: int,
        grace_seconds: float,
        access_log: bool = True,
        shared_port: bool = False,
        telemetry: Telemetry | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        self.plane = plane
        self.keys = keys
        self.address = f"{host}:{port}"
        self.options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if shared_port else 0),
        ]
        self.grace = grace_seconds
        self.access_log = access_log
        self.telemetry = telemetry
        self.port: int | None = None  # the port bound, once started (useful with port 0)
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None

    async def start(self) -> None:
        """Listen (inside the running loop: gRPC's asyncio server binds to it), and report SERVING for the
        server ("") and the inference service when every model can serve."""
        interceptors = [KeyInterceptor(self.keys, self.access_log)] if self.keys is not None else []
        server = grpc.aio.server(options=self.options, interceptors=interceptors)
        handlers = method_handlers(InferenceServicer(self.plane, access_log=self.access_log, telemetry=self.telemetry))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)  # looked up once, not per call
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server, pool=_reflection_pool())
        try:
            self.port = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise ConfigError(f"gRPC cannot listen on {self.address}: {exc}") from None
        await server.start()
        self._server = server
        serving = health_pb2.HealthCheckResponse.SERVING
        status = serving if self.plane.catalog.ready() else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE):
            await self._health.set(service, status)
        logger.info(f"gRPC listening on {self.address}", extra={"grpc_address": self.address})

    async def stop(self) -> None:
        """Health checks say NOT_SERVING, new calls are refused, calls in flight get the grace period to finish."""
        if self._server is None:
            return
        assert self._health is not None
        await self._health.enter_graceful_shutdown()
        await self._server.stop(self.grace)
        self._server = None


def _reflection_pool() -> descriptor_pool.DescriptorPool:
    """The three services' descriptors in one pool, for reflection: fnserve's own pool holds only the OIP's
    (see :mod:`~fnserve.adapters.grpc.proto`), the other two live in protobuf's default one."""
    pool = descriptor_pool.DescriptorPool()
    for file in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        pool.AddSerializedFile(file.serialized_pb)
    return pool
