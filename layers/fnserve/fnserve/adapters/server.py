"""The long-running server: the same app under uvicorn (uvloop + httptools), N worker processes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import FastAPI

from fnserve.adapters.http import create_app
from fnserve.aws.service import build_service, cascade_runner, result_store
from fnserve.core.batching import AdaptiveBatcher
from fnserve.core.service import InferenceService
from fnserve.core.settings import Settings


def app_factory() -> FastAPI:
    """Called once in every uvicorn worker process: that worker's warm service and app."""
    settings = Settings()
    store = result_store(settings)
    service = build_service(settings, store)
    app = create_app(
        service, settings, cascades=cascade_runner(settings, service), results=store, batchers=batchers(service)
    )
    return app


def batchers(service: InferenceService) -> dict[str, AdaptiveBatcher]:
    """An adaptive batcher for each model that asks for one (its default version)."""
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
        )
    return found


def serve(manifest: str, host: str = "127.0.0.1", port: int = 8080, workers: int = 1, access_log: bool = False) -> None:
    """Run the server until interrupted. Settings reach the workers through FNSERVE_* variables.

    The per-request access log is off unless asked for: at thousands of requests a second a
    structured log line costs as much as the model (timings are in Server-Timing regardless).
    """
    import uvicorn

    os.environ["FNSERVE_MANIFEST"] = manifest
    # Each worker sizes its ONNX Runtime threads as CPUs / workers (see Settings).
    os.environ["FNSERVE_PARALLEL_WORKERS"] = str(workers)
    # A long-running worker loads (and warms) every model before it takes traffic.
    os.environ.setdefault("FNSERVE_EAGER_LOAD", "true")
    os.environ.setdefault("FNSERVE_ACCESS_LOG", "true" if access_log else "false")
    Settings()  # refuse bad settings here, once, rather than in every worker
    uvicorn.run(
        "fnserve.adapters.server:app_factory",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
