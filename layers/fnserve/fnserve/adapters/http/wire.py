"""What the HTTP API writes without a web framework: a request's id from its headers, and ``{"error": ...}`` bodies.

Kept apart from :mod:`~fnserve.adapters.http.middleware` so that the inference road, the
batch function and the SnapStart hooks import no FastAPI, a large part of a cold start's imports.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import orjson

from fnserve.core.errors import FnserveError
from fnserve.observability.request_meta import new_request_id

# A scope key fnserve's HTTP protocol sets on each request: a callable that sends what the connection holds now. The
# answers of one turn of the event loop leave together at its end (``fnserve.adapters.http.protocol``); a refusal
# must not wait for them: its client is to try again shortly, or elsewhere, and hears at once.
SEND_NOW = "fnserve.send_now"


def answered(scope: Mapping[str, Any], status: int) -> None:
    """An answer of ``status`` is written whole: a refusal (503) is sent at once (``SEND_NOW``, where the server
    offers it), the others at the end of their turn."""
    if status == 503 and SEND_NOW in scope:
        scope[SEND_NOW]()


async def respond(
    scope: MutableMapping[str, Any],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    status: int,
    payload: bytes,
    media_type: str,
    headers: dict[str, str],
    rid: str,
) -> None:
    """A whole answer over ASGI: its status, length, type, ``headers`` and request id, then its body."""
    raw = [(b"content-length", str(len(payload)).encode()), (b"content-type", media_type.encode())]
    raw += [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"x-request-id", rid.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
    answered(scope, status)


def request_id(scope: Mapping[str, Any]) -> str:
    """The caller's X-Request-Id, else the Lambda request id, else a new one."""
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())
    for key, value in headers:
        if key == b"x-request-id" and value:
            return header_request_id(value)
    return unnamed_request_id(scope)


def header_request_id(value: bytes) -> str:
    """A request's id from its (non-empty) X-Request-Id header: the first 128 bytes of it."""
    return bytes(value[:128]).decode("latin-1")


def unnamed_request_id(scope: Mapping[str, Any]) -> str:
    """The id of a request that brought no X-Request-Id: the Lambda request id, else a new one."""
    rid = getattr(scope.get("aws.context"), "aws_request_id", None)
    return str(rid) if rid else new_request_id()


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def error_parts(error: FnserveError) -> tuple[int, bytes, dict[str, str]]:
    """An error as HTTP answers it: its status, ``{"error": message}``, and ``Retry-After`` when it says when."""
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else {}
    return error.status_code, error_body(error.message), headers
