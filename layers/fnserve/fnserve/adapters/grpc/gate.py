"""Who may call the gRPC service: without one of the server's API keys in the ``authorization`` metadata
("Bearer KEY", what tritonclient sends as a header), a call ends UNAUTHENTICATED before its message is parsed;
health checking and the OIP's liveness and readiness stay open for the platform's probes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health

from fnserve.adapters.grpc.service import SERVICE
from fnserve.adapters.keys import NOT_HELD, ApiKeys, name_caller
from fnserve.observability import logs

OPEN = frozenset(
    {
        f"/{health.SERVICE_NAME}/Check",
        f"/{health.SERVICE_NAME}/Watch",
        f"/{SERVICE}/ServerLive",
        f"/{SERVICE}/ServerReady",
    }
)
MISSING = "this server needs an API key: send it in the authorization metadata as Bearer KEY"

Handler = Any  # grpc.RpcMethodHandler: generic in its stubs alone


class KeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses the calls that carry none of ``keys``; an admitted call's key id joins its log lines and span."""

    def __init__(self, keys: ApiKeys, access_log: bool = True) -> None:
        self.keys = keys
        self.access_log = access_log

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]], details: Any
    ) -> Handler | None:
        handler = await continuation(details)
        if handler is None or details.method in OPEN:
            return handler
        header = next((v for k, v in details.invocation_metadata or () if k == "authorization"), None)
        caller = self.keys.caller(header)
        if caller is None:
            message = MISSING if header is None else NOT_HELD
            if self.access_log:
                logs.access("refused", {"transport": "grpc", "method": details.method, "status": 401, "error": message})
            return _refusing(handler, message)
        if handler.unary_unary is None:  # reflection's stream: nothing of a request's to log
            return handler
        behaviour = handler.unary_unary

        async def as_caller(request: Any, context: Any) -> Any:
            name_caller(caller)
            return await behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(as_caller, handler.request_deserializer, handler.response_serializer)


def _refusing(handler: Handler, message: str) -> Handler:
    """A handler of the same kind as ``handler`` that ends the call UNAUTHENTICATED, its message never parsed."""

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    skip = _ignored
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, skip, handler.response_serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, skip, handler.response_serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, skip, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, skip, handler.response_serializer)


def _ignored(message: bytes) -> None:
    return None
