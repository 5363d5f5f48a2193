"""Mangum for fnserve: Lambda events -> ASGI, answering whatever Host header a client sends.

Mangum 0.22 derives the ASGI ``server`` from the Host header with ``host.split(":")`` and
``int(port)``, so an IPv6 literal (``[::1]:443``), a malformed value (``a:b:c``,
``example.com:abc``) or a non-numeric ``X-Forwarded-Port`` raised out of the handler: the
invocation failed instead of answering. Clients choose the Host they send, and ALB and API
Gateway pass it through. For a request with such a header fnserve's handlers (Mangum's own,
through its ``custom_handlers`` hook) show Mangum a Host it can parse, then give the scope
the request's own header back with the server read as RFC 3986 reads it (the port ignored
where it is not a number); any other request costs one dictionary lookup. The app does not
route on Host, so the answer is the one any Host gets.

The same handlers build the scope once a request: Mangum's build it on every read of
``scope``, and read it twice (``__call__`` rebuilds the whole scope only to look at the
event's version), a share of a Lambda HTTP request's overhead worth saving.
"""

from __future__ import annotations

import logging
from typing import Any

from mangum import Mangum
from mangum.handlers import ALB, APIGateway, HTTPGateway
from mangum.types import ASGI, LambdaHandler, Scope

_PARSEABLE = "fnserve.invalid"  # a reserved name (RFC 6761), shown to Mangum in the header's place


def _port(value: str | None) -> int | None:
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def _mangum_parses(host: str, forwarded_port: str | None) -> bool:
    if ":" not in host:
        return forwarded_port is None or _port(forwarded_port) is not None
    name, _, port = host.partition(":")
    return ":" not in port and _port(port) is not None


def _server(host: str, forwarded_port: str | None, scheme: str) -> tuple[str, int]:
    """(host, port) of a Host header: ``name``, ``name:port``, ``[v6]``, ``[v6]:port``; a bad port is ignored."""
    default = _port(forwarded_port) or (80 if scheme == "http" else 443)
    if host.startswith("["):
        literal, _, rest = host.partition("]")
        return literal[1:], (_port(rest[1:]) if rest.startswith(":") else None) or default
    name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    return name, _port(port) or default


def _header(event: dict[str, Any], name: str) -> str | None:
    """A request header as Mangum would read it (case-insensitive; the last of several values)."""
    found = None
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            found = value
    for key, values in (event.get("multiValueHeaders") or {}).items():
        if key.lower() == name and values:
            found = values[-1]
    return found


def _with_parseable_host(event: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``event`` with Host and X-Forwarded-Port replaced by values Mangum parses."""
    replace = {"host": _PARSEABLE, "x-forwarded-port": "443"}
    copy = dict(event)
    if event.get("headers"):
        copy["headers"] = {k: replace.get(k.lower(), v) for k, v in event["headers"].items()}
    if event.get("multiValueHeaders"):
        copy["multiValueHeaders"] = {
            k: [replace[k.lower()]] if k.lower() in replace else v for k, v in event["multiValueHeaders"].items()
        }
    return copy


class _AnyHost:
    """Mixin over a Mangum handler: its scope, built once, for any Host or X-Forwarded-Port header."""

    event: dict[str, Any]
    _scope: Scope | None = None

    @property
    def scope(self) -> Scope:
        if self._scope is None:
            self._scope = self._build_scope()
        return self._scope

    def _build_scope(self) -> Scope:
        event = self.event
        odd = _odd_host(event)
        if not odd:
            return super().scope  # type: ignore[misc,no-any-return]
        host, forwarded_port = odd
        self.event = _with_parseable_host(event)
        try:
            scope: Scope = super().scope  # type: ignore[misc]
        finally:
            self.event = event
        originals = {b"host": host, b"x-forwarded-port": forwarded_port}
        scope["headers"] = [
            [key, (originals[key] or "").encode("latin-1", "replace") if key in originals else value]
            for key, value in scope["headers"]
            if key not in originals or originals[key] is not None
        ]
        scope["server"] = _server(host, forwarded_port, scope["scheme"])
        scope["aws.event"] = event
        return scope


def _odd_host(event: dict[str, Any]) -> tuple[str, str | None] | tuple[()]:
    """(Host, X-Forwarded-Port) when Mangum could not parse them, else ()."""
    headers = event.get("headers") or {}
    if "multiValueHeaders" not in event and "host" in headers:  # API Gateway v2, ALB: lowercase names
        host, forwarded_port = headers["host"], headers.get("x-forwarded-port")
    else:
        host, forwarded_port = _header(event, "host"), _header(event, "x-forwarded-port")
    if host is None or _mangum_parses(host, forwarded_port):
        return ()
    return host, forwarded_port


class _HTTPGateway(_AnyHost, HTTPGateway):
    pass


class _APIGateway(_AnyHost, APIGateway):
    pass


class _ALB(_AnyHost, ALB):
    pass


HANDLERS: list[type[LambdaHandler]] = [_ALB, _HTTPGateway, _APIGateway]  # Mangum's own order


def adapter(app: ASGI, text_mime_types: list[str]) -> Mangum:
    """Mangum over ``app`` (lifespan off: it would run on every invocation), answering any Host header."""
    # Mangum's INFO line a request repeats fnserve's access line, and CloudWatch bills every byte ingested;
    # its warnings and errors still go out.
    logging.getLogger("mangum.http").setLevel(logging.WARNING)
    return Mangum(app, lifespan="off", text_mime_types=text_mime_types, custom_handlers=HANDLERS)
