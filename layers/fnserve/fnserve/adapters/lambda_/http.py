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
from fnserve.adapters.keys import name_caller
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

    def translate(event: dict[str, Any], context: Any) -> dict[str, Any]:
        name_caller(api_key_id(event))  # the API-key authorizer's; set every time, none of the last invocation's
        return asgi(event, context)

    return lambda_handler(translate, telemetry.flush)


def api_key_id(event: dict[str, Any]) -> str | None:
    """The id of the key the API-key authorizer let the request in with (an HTTP API event's), if any."""
    authorizer = (event.get("requestContext") or {}).get("authorizer") or {}
    found = (authorizer.get("lambda") or {}).get("keyId") if isinstance(authorizer, dict) else None
    return found if isinstance(found, str) else None
