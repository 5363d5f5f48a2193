"""Who may call the HTTP API: a caller without one of the server's API keys is answered 401 from its headers alone,
its body never read, in the error shape of the API it called (V2's, OpenAI's, Cohere's, TEI's); the health checks
stay open for the platform's probes, and ``/metrics`` for the scrape unless a setting keys it."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fnserve.adapters.http.table import JSON_APIS, ROUTES, route_of
from fnserve.adapters.http.wire import error_parts, request_id, respond
from fnserve.adapters.keys import NOT_HELD, ApiKeys, name_caller
from fnserve.core.errors import FnserveError, Unauthorized
from fnserve.observability import logs

ASGIMessage = MutableMapping[str, Any]
Send = Callable[[ASGIMessage], Awaitable[None]]

# What a platform probes without credentials: liveness and readiness, SageMaker's and TEI's own.
OPEN = frozenset({"v2.live", "v2.ready", "sagemaker.ping", "tei.health"})
MISSING = "this server needs an API key: send it as Authorization: Bearer KEY"


class Gate:
    """The check in front of every HTTP route (:class:`~fnserve.adapters.http.infer.V2App` runs it first)."""

    def __init__(self, keys: ApiKeys, metrics_need_key: bool = False, access_log: bool = True) -> None:
        self.keys = keys
        self.access_log = access_log  # a refusal's line, as every request's: with the access log
        self.open = OPEN if metrics_need_key else OPEN | {"metrics.scrape"}
        # The open routes' last segments: any other path is no probe, and skips the table's lookup (inference's road).
        self._tails = tuple({"/" + r.path.rsplit("/", 1)[1] for r in ROUTES if r.endpoint in self.open})

    async def admitted(self, scope: ASGIMessage, send: Send) -> bool:
        """Whether the request may go on; if not, its 401 is sent. The key's id joins every log line of the
        request and its span."""
        path: str = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if path.endswith(self._tails):
            route = route_of(scope["method"], path)
            if route is not None and route.endpoint in self.open:
                return True
        header = next((value for name, value in scope.get("headers", ()) if name == b"authorization"), None)
        caller = self.keys.caller(header)
        if caller is not None:
            name_caller(caller)
            return True
        route = route_of(scope["method"], path)  # the API it called, for the shape of its refusal
        error = Unauthorized(MISSING if header is None else NOT_HELD)
        status, body, headers = _parts(route.group if route is not None else "v2", error)
        if self.access_log:
            logs.access("refused", {"status": status, "method": scope["method"], "path": path, "error": error.message})
        headers["www-authenticate"] = "Bearer"
        await respond(scope, send, status, body, "application/json", headers, request_id(scope))
        return False


def _parts(group: str, error: FnserveError) -> tuple[int, bytes, dict[str, str]]:
    """The refusal in the shape of the API ``group`` belongs to (V2's for the others)."""
    if group in JSON_APIS:
        parts: Callable[[FnserveError], tuple[int, bytes, dict[str, str]]] = importlib.import_module(
            JSON_APIS[group][0]
        ).error_parts
        return parts(error)
    return error_parts(error)
