"""The HTTP API: Open Inference Protocol V2, shared by Lambda (Mangum), Cloud Functions and the server (uvicorn).

Every route translates HTTP to a :class:`~fnserve.core.dataplane.DataPlane` call and its
answer back to HTTP; none decides anything about inference. :class:`V2App` answers inference
requests itself, as plain ASGI (:mod:`~fnserve.adapters.http.infer`); the FastAPI app
(:mod:`~fnserve.adapters.http.routes`: health, metadata, results, the OpenAPI document,
inference under a ``root_path``, SageMaker's routes) is built when a request first needs it, so
a Lambda container whose first request is an inference answers it without importing FastAPI.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fnserve.adapters.envelope import NoTelemetry, Telemetry
from fnserve.adapters.http.infer import ASGIMessage, InferenceRoute, Receive, Send
from fnserve.adapters.logs import logger
from fnserve.core.dataplane import DataPlane
from fnserve.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from fnserve.adapters.http.routes import Companion


def create_app(
    plane: DataPlane,
    settings: Settings | None = None,
    telemetry: Telemetry | None = None,
    *,
    on_shutdown: Callable[[], None] | None = None,
    companions: Sequence[Companion] = (),
    metrics: Callable[[], bytes] | None = None,
) -> V2App:
    """The ASGI application serving ``plane``; ``companions`` start with the server and stop first when it
    stops, then the batchers, then ``on_shutdown`` runs; ``metrics`` renders ``GET /metrics`` (Prometheus)."""
    settings = settings or Settings()
    logger.setLevel(settings.log_level)
    return V2App(InferenceRoute(plane, settings, telemetry or NoTelemetry()), on_shutdown, companions, metrics)


class V2App:
    """The V2 API over ASGI: ``POST /v2/models/{name}[/versions/{v}]/infer`` answered here, the rest by FastAPI."""

    def __init__(
        self,
        inference: InferenceRoute,
        on_shutdown: Callable[[], None] | None = None,
        companions: Sequence[Companion] = (),
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.inference = inference
        self.on_shutdown = on_shutdown
        self.companions = tuple(companions)
        self.metrics = metrics
        self.state = types.SimpleNamespace()  # what the process keeps beside the app (the server's pool)
        self._fastapi: FastAPI | None = None

    def fastapi(self) -> FastAPI:
        """The FastAPI app of the other routes, built on first use (or ahead, by a server at start)."""
        if self._fastapi is None:
            from fnserve.adapters.http import routes

            self._fastapi = routes.build(self.inference, self.on_shutdown, self.companions, self.metrics)
        return self._fastapi

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            parts = scope["path"].split("/")
            # ["", "v2", "models", name, "infer"] or [..., name, "versions", version, "infer"]
            if parts[-1] == "infer" and parts[1:3] == ["v2", "models"] and all(parts[3:-1]):
                if len(parts) == 5:
                    await self.inference.infer_asgi(scope, receive, send, parts[3], None)
                    return
                if len(parts) == 7 and parts[4] == "versions":
                    await self.inference.infer_asgi(scope, receive, send, parts[3], parts[5])
                    return
        await (self._fastapi or self.fastapi())(scope, receive, send)
