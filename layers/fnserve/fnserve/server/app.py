"""A ``fnserve serve`` front process's app: the data plane ``bootstrap`` builds, behind HTTP and gRPC, with its
metrics, access lines and the readiness of its sibling front processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fnserve import bootstrap
from fnserve.adapters.http.app import create_app
from fnserve.adapters.keys import ApiKeys, api_keys
from fnserve.core.errors import ConfigError
from fnserve.observability import tracing
from fnserve.observability.periodic import Every
from fnserve.server import fronts
from fnserve.settings import Settings

if TYPE_CHECKING:
    from fnserve.adapters.http.infer import Companion, V2App
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.serving.dataplane import DataPlane
    from fnserve.observability.envelope import Telemetry
    from fnserve.workers.remote import Overflow, Pools


def grpc_server(
    settings: Settings, plane: DataPlane, telemetry: Telemetry | None = None, keys: ApiKeys | None = None
) -> Companion:
    """The OIP gRPC service on ``settings.grpc_port``, over the HTTP app's data plane (asking for ``keys``)."""
    try:
        from fnserve.adapters.grpc.server import GrpcServer
    except ImportError as exc:
        from fnserve.core.extras import install_hint

        raise ConfigError(f"gRPC needs the grpc extra ({install_hint('grpc')}): {exc}") from None
    assert settings.grpc_port is not None
    return GrpcServer(
        plane,
        settings.grpc_host,
        settings.grpc_port,
        max_message_bytes=settings.max_request_bytes,
        grace_seconds=settings.inference_timeout_seconds,
        access_log=settings.access_log,
        shared_port=settings.server_processes > 1,
        telemetry=telemetry,
        keys=keys,
    )


def server_app(
    settings: Settings, pool: Overflow | Pools | None = None, service: InferenceService | None = None
) -> V2App:
    """A ``fnserve serve`` front process's app: models in ``pool``'s workers, or in this process when there is no
    pool (``service``, when they are loaded already); metrics, gRPC and the readiness of its sibling processes."""

    keys = api_keys(settings)
    store = bootstrap.result_store(settings, for_requests=True)
    service = service or bootstrap.build_service(settings, store, pool)
    # Blocking calls wait in threads when there are any: models in workers, DynamoDB, SQS follow-ups.
    blocking = pool is not None or store is not None or bool(service.registry.manifest.cascades)
    metrics = None
    if settings.metrics:
        from fnserve.observability.metrics import ServerMetrics

        metrics = ServerMetrics()
    plane = bootstrap.build_dataplane(
        settings,
        service=service,
        store=store,
        batching=True,
        offload=blocking,
        observers=metrics.batch_observers if metrics is not None else None,  # its batchers counted from the start
    )
    # Sessions of each model running at once: every front process's own, or its workers'.
    per_process = (settings.parallel_workers + settings.gpu_workers) if pool is not None else 1
    plane.catalog.instances = settings.server_processes * per_process
    tracing.configure()
    if metrics is not None:
        metrics.watch(plane, pool)
    companions: list[Companion] = [metrics] if metrics is not None else []  # stopped last: its final flush
    if settings.access_log:
        from fnserve.observability.logs import AccessLines

        companions.append(AccessLines())  # stopped after gRPC: the last lines of its requests leave too
    if settings.grpc_port is not None:
        telemetry = metrics.telemetry("grpc") if metrics is not None else None
        companions.append(grpc_server(settings, plane, telemetry, keys))
    listening = fronts.all_listening()  # one of several front processes: ready once all of them listen
    if listening is not None:  # counted in last, once its gRPC server (if any) is up too
        plane.catalog.ready_when(listening)
        companions.append(listening)
        shared = os.environ.get(fronts.STATISTICS_DIR_ENV)
        if shared:  # each one's statistics where the others add them up, every SHARE_SECONDS and at stop
            companions.append(Every(fronts.SHARE_SECONDS, plane.statistics.share(Path(shared))))
    app = create_app(
        plane,
        settings,
        metrics.telemetry("http") if metrics is not None else None,
        on_shutdown=pool.close if pool is not None else None,
        companions=companions,
        metrics=metrics.render if metrics is not None else None,
        keys=keys,
    )
    app.state.plane = plane
    app.state.pool = pool
    return app  # its FastAPI app (the routes but inference and health) built in a thread after its first answer
