"""The emulator's HTTP gateway: match a route, turn the request into its API Gateway event, and back.

Like API Gateway, it answers on its own when the integration fails, with API Gateway's own
generic bodies, never the function's error (that goes to the console, with its traceback,
as it would go to the function's log): an HTTP API answers 500 for a function error or a
malformed response and 503 for a timeout, a REST API 502 and 504.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from fnserve.aws import events
from fnserve.core.errors import FnserveError, InvocationTimeout
from fnserve.emulator.auth import RouteAuth
from fnserve.emulator.schedules import Schedule
from fnserve.workers.pool import Pool

TEXT_TYPES = ("application/json", "text/", "application/xml", "application/x-www-form-urlencoded")
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@dataclass
class HttpRoute:
    """A route of the template's API: ``version`` "2.0" (HTTP API) or "1.0" (REST API); ``auth``, the check its
    authorisation type asks for (none: every request goes through)."""

    method: str
    path: str
    version: str
    function: str
    auth: RouteAuth | None = None

    def __post_init__(self) -> None:
        regex = re.sub(r"\{(\w+)\+\}", r"(?P<\1>.+)", self.path)
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", regex)
        self.pattern = re.compile(f"^{regex}$")

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """The path parameters if this route takes the request, else None."""
        found = self.pattern.match(path)
        if found is None or self.method not in ("ANY", method):
            return None
        return found.groupdict()


def gateway_app(
    routes: list[HttpRoute],
    pools: Mapping[str, Pool],
    info: Callable[[], Awaitable[dict[str, Any]]],
    schedules: Sequence[Schedule] = (),
) -> Starlette:
    """The gateway as an ASGI app; ``GET /_fnserve/local`` answers ``info()``, and
    ``POST /_fnserve/schedules/{function}/{event}`` runs a schedule now and answers what the function returned."""
    by_name = {(s.function, s.event): s for s in schedules}

    async def local_info(request: Request) -> Response:
        return JSONResponse(await info())

    async def run_schedule(request: Request) -> Response:
        function, event = request.path_params["function"], request.path_params["event"]
        schedule = by_name.get((function, event))
        if schedule is None:
            known = ", ".join(f"{f}/{e}" for f, e in by_name) or "none"
            return JSONResponse({"error": f"no schedule {function}/{event}; the template's: {known}"}, 404)
        try:
            response = await asyncio.wrap_future(pools[function].invoke(schedule.payload(datetime.now(UTC))))
        except FnserveError as exc:  # this is the emulator's own route: the error is the developer's to see
            return JSONResponse({"error": exc.message}, status_code=502)
        body = {"function": function, "event": event, "response": response}
        return Response(json.dumps(body, default=str), media_type="application/json")

    async def gateway(request: Request) -> Response:
        for route in routes:
            params = route.match(request.method, request.url.path)
            if params is not None:
                break
        else:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        body = await request.body()
        event = to_event(request, route, params, body)
        if route.auth is not None:
            checked = await route.auth.check(request, body, event, pools)
            if isinstance(checked, Response):
                return checked
            if checked.authorizer is not None and route.version == "2.0":
                event["requestContext"]["authorizer"] = checked.authorizer
        try:
            response = await asyncio.wrap_future(pools[route.function].invoke(event))
        except InvocationTimeout:
            return integration_failed(route, timed_out=True)
        except FnserveError:
            return integration_failed(route)
        return to_response(response, route)

    return Starlette(
        routes=[
            StarletteRoute("/_fnserve/local", local_info, methods=["GET"]),
            StarletteRoute("/_fnserve/schedules/{function}/{event}", run_schedule, methods=["POST"]),
            StarletteRoute("/{path:path}", gateway, methods=METHODS),
        ]
    )


def integration_failed(route: HttpRoute, timed_out: bool = False) -> Response:
    """API Gateway's own answer when the function failed (or timed out), by API type."""
    if route.version == "2.0":  # HTTP API
        if timed_out:
            return JSONResponse({"message": "Service Unavailable"}, status_code=503)
        return JSONResponse({"message": "Internal Server Error"}, status_code=500)
    if timed_out:  # REST API
        return JSONResponse({"message": "Endpoint request timed out"}, status_code=504)
    return JSONResponse({"message": "Internal server error"}, status_code=502)


def to_event(request: Request, route: HttpRoute, params: dict[str, str], body: bytes) -> dict[str, Any]:
    """The event ``route``'s function gets for ``request``."""
    binary = bool(body) and not _is_text(request.headers.get("content-type", ""), body)
    source_ip = request.client.host if request.client else "127.0.0.1"
    if route.version == "2.0":
        return events.http_api_event(
            request.method,
            request.url.path,
            route_key=f"{route.method} {route.path}",
            headers=dict(request.headers.items()),
            body=body or None,
            binary=binary,
            query=request.url.query,
            path_parameters=params,
            source_ip=source_ip,
            domain=request.url.hostname or "localhost",
        )
    return events.rest_api_event(
        request.method,
        request.url.path,
        resource=route.path,
        headers={name: request.headers.getlist(name) for name in request.headers},
        body=body or None,
        binary=binary,
        query=request.url.query,
        path_parameters=params,
        source_ip=source_ip,
    )


def _is_text(content_type: str, body: bytes) -> bool:
    if content_type and not content_type.startswith(TEXT_TYPES):
        return False
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


def to_response(response: Any, route: HttpRoute) -> Response:
    """The HTTP response for a function's proxy-integration answer.

    An answer without ``statusCode`` is, for an HTTP API (payload 2.0), a 200 whose body is the
    answer (as JSON unless it is a string); for a REST API, a malformed answer: 502.
    """
    if not isinstance(response, dict) or "statusCode" not in response:
        if route.version != "2.0":
            return integration_failed(route)
        if isinstance(response, str):
            return Response(response, status_code=200, media_type="application/json")
        return JSONResponse(response, status_code=200)
    body = response.get("body") or ""
    content = base64.b64decode(body) if response.get("isBase64Encoded") else str(body).encode()
    headers = {k: str(v) for k, v in (response.get("headers") or {}).items()}
    for key, values in (response.get("multiValueHeaders") or {}).items():
        headers[key] = ", ".join(str(v) for v in values)
    headers.pop("content-length", None)
    return Response(content, status_code=int(response["statusCode"]), headers=headers)
