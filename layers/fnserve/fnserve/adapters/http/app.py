"""The HTTP API: Open Inference Protocol V2, shared by Lambda (Mangum), Cloud Functions and the server (uvicorn).

Every route translates HTTP to a :class:`~fnserve.core.serving.dataplane.DataPlane` call and its
answer back to HTTP; none decides anything about inference. :func:`create_app` composes it: a
:class:`~fnserve.adapters.http.infer.V2App` that answers inference requests itself, as plain ASGI,
and the FastAPI app of the other routes (:mod:`~fnserve.adapters.http.routes`: health, metadata,
results, the OpenAPI document, inference under a ``root_path``, SageMaker's routes), built when a
request first needs it, so a Lambda container whose first request is an inference answers it
without importing FastAPI.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fnserve.adapters.http.infer import InferenceRoute, V2App, json_apis
from fnserve.core.serving.dataplane import DataPlane
from fnserve.observability import logs
from fnserve.observability.envelope import NoTelemetry, Telemetry
from fnserve.observability.logs import logger
from fnserve.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from fnserve.adapters.http.infer import Companion
    from fnserve.adapters.keys import ApiKeys


def create_app(
    plane: DataPlane,
    settings: Settings | None = None,
    telemetry: Telemetry | None = None,
    *,
    on_shutdown: Callable[[], None] | None = None,
    companions: Sequence[Companion] = (),
    metrics: Callable[[], bytes] | None = None,
    keys: ApiKeys | None = None,
) -> V2App:
    """The ASGI application serving ``plane``; ``companions`` start with the server and stop first when it
    stops, then the batchers, then ``on_shutdown`` runs; ``metrics`` renders ``GET /metrics`` (Prometheus); with
    ``keys`` (a server's), only callers with one of them are answered."""
    settings = settings or Settings()
    logger.setLevel(logs.level(settings.log_level if "log_level" in settings.fields_set else None))
    inference = InferenceRoute(plane, settings, telemetry or NoTelemetry())

    apis = json_apis(inference)
    gate = None
    if keys is not None:
        from fnserve.adapters.http.gate import Gate

        gate = Gate(keys, settings.metrics_need_key, settings.access_log)

    def routes() -> FastAPI:
        from fnserve.adapters.http import routes  # FastAPI: not on a Lambda container's first inference

        return routes.build(inference, metrics, apis)

    return V2App(inference, routes, companions, on_shutdown, apis, gate)
