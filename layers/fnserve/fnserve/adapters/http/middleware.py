"""Per-request plumbing of the HTTP app: request ids, JSON responses, and errors rendered as ``{"error": ...}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fnserve.adapters.http.wire import answered, error_body, error_parts, request_id
from fnserve.core.errors import ClientGone, FnserveError
from fnserve.observability.logs import logger, request_keys

JSON = "application/json"


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type=JSON,
        headers=headers,
    )


def error_response(message: str, status_code: int, headers: Mapping[str, str] | None = None) -> Response:
    return Response(error_body(message), status_code=status_code, media_type=JSON, headers=headers)


class RequestContext:
    """Pure ASGI middleware: request id in every log line and in the response; no 500 leaks details.

    (Starlette's BaseHTTPMiddleware would cost a task and a stream per request.)
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        request_keys(request_id=rid)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientGone:
            return  # the client left before its request was read: nobody to answer
        except Exception:
            logger.exception("unhandled error", extra={"path": scope.get("path")})
            if started:
                raise
            await error_response("internal server error", 500)(scope, receive, send_with_id)


class ErrorAnswer(Response):
    """fnserve's error as an answer, sent as the V2 route sends one (a refusal at once: ``wire.answered``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        answered(scope, self.status_code)


def install_error_handlers(app: FastAPI) -> None:
    """fnserve's errors, FastAPI's validation errors and Starlette's HTTP errors, all as ``{"error": ...}``."""

    async def fnserve_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, FnserveError)
        status, body, headers = error_parts(exc)
        return ErrorAnswer(body, status_code=status, media_type=JSON, headers=headers)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return error_response(problems, 400)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(str(exc.detail), exc.status_code, exc.headers)

    app.add_exception_handler(FnserveError, fnserve_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
