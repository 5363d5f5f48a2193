"""The HTTP function on Google Cloud: the V2 app that Lambda serves, behind functions-framework's ASGI mode.

functions-framework (``--asgi``, or ``functions_framework.aio``) routes every path to one
function and hands it a Starlette request. The function returns a response that *is* the
V2 app: Starlette calls it with the request's own ASGI scope, receive and send, so fnserve's
app reads the body and writes the answer itself (binary tensors untouched, streaming as it
likes), with no request or response translated in between. Logs are Cloud Logging's
structured JSON, each line carrying the request's trace (:mod:`fnserve.adapters.gcp.logs`).
The function starts as the Lambda ones do (:mod:`fnserve.adapters.handler`).

    functions-framework --target infer --source functions/gcp_api/main.py --signature-type http --asgi
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fnserve.adapters.gcp.logs import bind_trace, use_cloud_logging
from fnserve.adapters.handler import start_requests
from fnserve.adapters.http.app import create_app
from fnserve.core.execution.service import InferenceService
from fnserve.settings import Settings

Asgi = Callable[[dict[str, Any], Any, Any], Any]


class AppResponse(Response):
    """A response that hands the request to an ASGI app: whatever the app sends is the response."""

    def __init__(self, app: Asgi) -> None:  # no body or headers of its own
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        bind_trace(scope)
        await self.app(scope, receive, send)


def create_function(
    service: InferenceService | None = None, settings: Settings | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """The HTTP function; build it once per instance, at import (warm globals)."""
    # An instance takes concurrent requests (Cloud Run's concurrency).
    settings, plane = start_requests(settings, service, concurrent=True, prepare=use_cloud_logging)
    response = AppResponse(create_app(plane, settings))

    async def infer(request: Request) -> Response:  # async: run on the loop, not in the framework's threads
        return response

    return infer
