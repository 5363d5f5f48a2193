"""The long-running server: one front process under uvicorn, and a pool of inference workers.

The front process parses HTTP, validates, caches, batches and runs cascades; with
``parallel_workers >= 1`` the models live in that many worker processes (spawned, warm, see
:mod:`fnserve.workers.remote`), so inference runs in parallel beside the event loop. With
``parallel_workers = 0`` inference runs in the front process itself: no inter-process hop,
which is the better choice for models so small that the hop costs more than the model
(``make bench`` shows where that line is).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fnserve import bootstrap
from fnserve.adapters.http.app import V2App, create_app
from fnserve.core._heap import freeze_heap
from fnserve.core.service import InferenceService
from fnserve.settings import Settings
from fnserve.workers.pool import FunctionSpec, WorkerPool


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_ready: Callable[[InferenceService], None] | None = None,
) -> None:
    """Load every model (in the workers, or here with no workers), then serve until SIGINT or SIGTERM.

    On a signal, requests in flight finish, then the workers stop (the app's lifespan). The
    workers ignore signals themselves, and exit on their own if this process is killed
    outright (their pipe to it closes). With ``server_processes > 1``, uvicorn runs that many
    front processes on the port, each building its own app (:func:`app_factory`).
    """
    import uvicorn

    settings = bootstrap.with_local_manifest(settings.model_copy(update={"eager_load": True}))
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        "http": "httptools",
        "access_log": False,
        "log_level": "warning",
    }
    if settings.server_processes > 1:
        # Every model is loaded here once, and dropped: one that cannot load stops the start with
        # its reason, instead of uvicorn's supervisor restarting front processes that cannot start.
        checked = bootstrap.build_service(settings)
        if on_ready is not None:
            on_ready(checked)
        del checked
        os.environ.update(settings_env(settings))  # how the settings reach the front processes
        uvicorn.run(f"{__name__}:app_factory", factory=True, workers=settings.server_processes, **options)
        return
    app = front(settings)
    try:
        if on_ready is not None:
            on_ready(app.state.plane.service)
        uvicorn.Server(uvicorn.Config(app, **options)).run()
    finally:
        if app.state.pool is not None:  # the lifespan closed it already, unless uvicorn never started
            app.state.pool.close()


def app_factory() -> V2App:
    """One front process of a multi-process server (uvicorn calls it in each), from FNSERVE_* settings."""
    return front(Settings())


def front(settings: Settings) -> V2App:
    """A front process's app, with its inference workers started (none with ``parallel_workers = 0``)."""
    pool = inference_pool(settings) if settings.parallel_workers else None
    try:
        app = build_app(settings, pool)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    freeze_heap()
    return app


def settings_env(settings: Settings) -> dict[str, str]:
    """What a child process (a front process, an inference worker) needs of the settings, as FNSERVE_*."""
    env = {
        "FNSERVE_MANIFEST": settings.manifest,
        "FNSERVE_PARALLEL_WORKERS": str(settings.parallel_workers),
        "FNSERVE_SERVER_PROCESSES": str(settings.server_processes),
        "FNSERVE_EAGER_LOAD": "true",
        "FNSERVE_ACCESS_LOG": "true" if settings.access_log else "false",
        "FNSERVE_MODEL_CACHE_DIR": str(settings.model_cache_dir),
        "FNSERVE_LOG_LEVEL": settings.log_level,
    }
    if settings.intra_op_threads is not None:
        env["FNSERVE_INTRA_OP_THREADS"] = str(settings.intra_op_threads)
    return env


def inference_pool(settings: Settings) -> WorkerPool:
    """``parallel_workers`` warm inference workers; the settings they need cross as environment variables."""
    spec = FunctionSpec(
        name="inference",
        code_dir=os.getcwd(),
        handler="fnserve.workers.inference.handler",
        env=settings_env(settings),
        timeout=settings.inference_timeout_seconds,
    )
    return WorkerPool(spec, settings.parallel_workers).start()


def build_app(settings: Settings, pool: WorkerPool | None = None) -> V2App:
    """The server's app: models in ``pool``'s workers, or in this process when there is no pool."""
    store = bootstrap.result_store(settings, for_requests=True)
    service = bootstrap.build_service(settings, store, pool)
    # Blocking calls wait in threads when there are any: models in workers, DynamoDB, SQS follow-ups.
    blocking = pool is not None or store is not None or bool(service.registry.manifest.cascades)
    plane = bootstrap.build_dataplane(settings, service=service, store=store, batching=True, offload=blocking)
    app = create_app(plane, settings, on_shutdown=pool.close if pool is not None else None)
    app.state.plane = plane
    app.state.pool = pool
    app.fastapi()  # built now: a server's first health check should not pay for it
    return app
