"""The long-running server: one front process under uvicorn, and a pool of inference workers.

The front process parses HTTP, validates, caches, batches and runs cascades; with
``parallel_workers >= 1`` the models live in that many worker processes (spawned, warm, see
:mod:`fnserve.core.pooled`), so inference runs in parallel beside the event loop. With
``parallel_workers = 0`` inference runs in the front process itself: no inter-process hop,
which is the better choice for models so small that the hop costs more than the model
(``make bench`` shows where that line is).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from fnserve.adapters.http import create_app
from fnserve.aws.service import build_service, cache_backend, cascade_runner, result_store, with_local_manifest
from fnserve.core._heap import freeze_heap
from fnserve.core.batching import AdaptiveBatcher
from fnserve.core.cache import ResultCache
from fnserve.core.manifest import load_manifest
from fnserve.core.pool import FunctionSpec, WorkerPool
from fnserve.core.pooled import PooledRegistry
from fnserve.core.service import InferenceService
from fnserve.core.settings import Settings


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

    settings = with_local_manifest(settings.model_copy(update={"eager_load": True}))
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
        checked = build_service(settings)
        if on_ready is not None:
            on_ready(checked)
        del checked
        os.environ.update(settings_env(settings))  # how the settings reach the front processes
        uvicorn.run(f"{__name__}:app_factory", factory=True, workers=settings.server_processes, **options)
        return
    app = front(settings)
    try:
        if on_ready is not None:
            on_ready(app.state.service)
        uvicorn.Server(uvicorn.Config(app, **options)).run()
    finally:
        if app.state.pool is not None:  # the lifespan closed it already, unless uvicorn never started
            app.state.pool.close()


def app_factory() -> FastAPI:
    """One front process of a multi-process server (uvicorn calls it in each), from FNSERVE_* settings."""
    return front(Settings())


def front(settings: Settings) -> FastAPI:
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
        handler="fnserve.adapters.inference_worker.handler",
        env=settings_env(settings),
        timeout=settings.inference_timeout_seconds,
    )
    return WorkerPool(spec, settings.parallel_workers).start()


def build_app(settings: Settings, pool: WorkerPool | None = None) -> FastAPI:
    """The server's app: models in ``pool``'s workers, or in this process when there is no pool."""
    store = result_store(settings)
    if pool is None:
        service = build_service(settings, store)
    else:
        registry = PooledRegistry(load_manifest(settings.manifest), pool)
        service = InferenceService(registry, ResultCache(settings.cache_max_bytes, cache_backend(store)))
    app = create_app(
        service,
        settings,
        cascades=cascade_runner(settings, service),
        results=store,
        batchers=batchers(service, max_concurrent=max(1, settings.parallel_workers)),
        offload=pool is not None,
        on_shutdown=pool.close if pool is not None else None,
    )
    app.state.service = service
    app.state.pool = pool
    return app


def batchers(service: InferenceService, max_concurrent: int = 1) -> dict[str, AdaptiveBatcher]:
    """An adaptive batcher for each model that asks for one (its default version).

    ``max_concurrent`` batches of a model run at once: one per worker process.
    """
    found = {}
    for name in service.registry.names():
        settings = service.registry.resolve(name)
        if settings.max_batch_time_ms is None:
            continue

        async def run(feed: dict[str, Any], model: str = name) -> dict[str, Any]:
            # In a thread: the event loop keeps accepting (and batching) requests meanwhile.
            return await asyncio.to_thread(service.run, model, feed)

        found[name] = AdaptiveBatcher(
            run,
            max_batch_size=settings.max_batch_size,
            max_batch_time=settings.max_batch_time_ms / 1000,
            buckets=settings.length_buckets,
            pad_inputs=settings.pad_inputs,
            pad_value=settings.pad_value,
            max_concurrent=max_concurrent,
        )
    return found
