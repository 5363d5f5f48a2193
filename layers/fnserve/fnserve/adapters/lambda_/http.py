"""The Lambda HTTP handler: API Gateway (REST v1, HTTP API v2) and ALB events -> Mangum -> the app.

Everything is built once per container, at import of the function's ``app.py`` (warm
globals, started by the handler base, :mod:`fnserve.adapters.handler`); Mangum's lifespan is
off, since Mangum would run it on every invocation, and any Host header a client sends is
answered (:mod:`fnserve.adapters.lambda_.asgi`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fnserve.adapters.handler import lambda_handler, start_requests
from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_ import asgi as lambda_asgi
from fnserve.adapters.lambda_ import snapstart
from fnserve.core.execution.service import InferenceService
from fnserve.observability.emf import EmfTelemetry
from fnserve.settings import Settings

# Only JSON is text; everything else (the binary tensor extension's application/octet-stream)
# is base64-encoded for API Gateway, which decodes it back to bytes for the client.
TEXT_MIME_TYPES = ["application/json"]

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


def create_handler(
    service: InferenceService | None = None,
    settings: Settings | None = None,
    telemetry: EmfTelemetry | None = None,
) -> LambdaHandler:
    """The Lambda handler for the HTTP API; build it once, at import."""
    settings, plane = start_requests(settings, service, ready=snapstart.register)
    telemetry = telemetry or EmfTelemetry()
    asgi = lambda_asgi.adapter(create_app(plane, settings, telemetry=telemetry), TEXT_MIME_TYPES)
    return lambda_handler(asgi, telemetry.flush)
