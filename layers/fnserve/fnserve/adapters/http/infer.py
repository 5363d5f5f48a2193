"""The V2 inference route over HTTP: a request's body decoded (V2 JSON, or Triton's binary tensor extension),
its answer encoded, with the request id, ``Server-Timing`` and cache headers; the rest is the
envelope every transport shares (:meth:`fnserve.core.dataplane.DataPlane.serve`).

Inference requests take a shorter road than the other routes: :class:`V2App` answers them as
plain ASGI, before Starlette's middleware stack, router and FastAPI's dependency solving (~60 µs
a request, more than the digits model's own run), with the same request id, errors, headers,
log line and metrics as the FastAPI route.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fnserve.adapters.http import compression
from fnserve.adapters.http.wire import answered, error_parts, header_request_id, server_timing, unnamed_request_id
from fnserve.core.dataplane import Answer, DataPlane
from fnserve.core.errors import BadRequest, ClientGone, FnserveError, PayloadTooLarge
from fnserve.core.tensors import JSON_HEADER, InferenceRequest, decode_request, encode_response
from fnserve.observability.envelope import RequestWatcher, Telemetry
from fnserve.observability.logs import logger, request_keys
from fnserve.settings import Settings

ASGIMessage = MutableMapping[str, Any]  # as Starlette and Mangum type them
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]

ASGIApp = Callable[[ASGIMessage, Receive, Send], Awaitable[None]]

JSON = "application/json"
BINARY = "application/octet-stream"


class V2App:
    """The V2 API over ASGI: ``POST /v2/models/{name}[/versions/{v}]/infer`` answered here, the rest by FastAPI."""

    def __init__(self, inference: InferenceRoute, routes: Callable[[], ASGIApp]) -> None:
        self.inference = inference
        self.routes = routes  # builds the app of the other routes
        self.state = types.SimpleNamespace()  # what the process keeps beside the app (the server's pool)
        self._fastapi: ASGIApp | None = None

    def fastapi(self) -> ASGIApp:
        """The FastAPI app of the other routes, built on first use (or ahead, by a server at start)."""
        if self._fastapi is None:
            self._fastapi = self.routes()
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


class InferenceRoute:
    """The inference route's work, whichever road a request took: decode, infer, encode, log, record."""

    def __init__(self, plane: DataPlane, settings: Settings, telemetry: Telemetry) -> None:
        self.plane = plane
        self.watcher = RequestWatcher("http", telemetry, access_log=settings.access_log)
        self.limit = settings.max_request_bytes
        self.max_wait = settings.max_wait_seconds
        self.default_model = settings.default_model

    async def infer_asgi(
        self, scope: ASGIMessage, receive: Receive, send: Send, name: str, version: str | None
    ) -> None:
        """One inference over ASGI, with what the FastAPI app's ``RequestContext`` and error handlers add."""
        rid = declared = json_length = traceparent = encoding = accept = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value.decode("latin-1")
            elif key == b"inference-header-content-length":
                json_length = value.decode("latin-1")
            elif key == b"traceparent":
                traceparent = value.decode("latin-1")
            elif key == b"content-encoding":
                encoding = value.decode("latin-1")
            elif key == b"accept-encoding":
                accept = value.decode("latin-1")
            elif key == b"x-request-id" and value and rid is None:
                rid = header_request_id(value)
        if rid is None:
            rid = unnamed_request_id(scope)
        request_keys(request_id=rid)
        headers: dict[str, str]
        refusal = self.plane.refusal(self.watcher, name, version, traceparent)
        if refusal is not None:  # an overloaded model's, from the headers alone: its body never read
            status, payload, headers = error_parts(refusal)
            media_type = JSON
        else:
            try:
                payload, media_type, headers = await self.answer(
                    name,
                    version,
                    read_body(receive, declared, self.limit),
                    json_length,
                    traceparent,
                    encoding=encoding,
                    accept=accept,
                )
                status = 200
            except FnserveError as exc:
                status, payload, headers = error_parts(exc)
                media_type = JSON
            except ClientGone:
                return  # nobody to answer
            except Exception:  # reading the body failed in a way no error of fnserve's says
                logger.exception("unhandled error", extra={"path": scope.get("path")})
                status, payload, headers = error_parts(FnserveError("internal server error"))
                media_type = JSON
        raw = [(b"content-length", str(len(payload)).encode()), (b"content-type", media_type.encode())]
        raw += [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"x-request-id", rid.encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload})
        answered(scope, status)

    async def answer(
        self,
        name: str,
        version: str | None,
        body: Awaitable[bytes],
        json_length: str | None,
        traceparent: str | None = None,
        watcher: RequestWatcher | None = None,
        *,
        encoding: str | None = None,
        accept: str | None = None,
    ) -> tuple[bytes, str, dict[str, str]]:
        """One V2 inference (JSON, or the binary tensor extension): (payload, media type, headers).
        ``encoding``: the body's Content-Encoding; ``accept``: the Accept-Encoding the answer may use."""
        limit = self.limit

        def decode(raw: bytes) -> InferenceRequest:
            if encoding is not None:  # the binary extension's JSON length counts the decompressed body, as Triton's
                raw = compression.decompress(raw, encoding, limit)
            return decode_request(raw, _json_length(json_length))

        payload, media_type, headers = await self.serve(name, version, body, decode, encode_v2, traceparent, watcher)
        coding = compression.accepted(accept)
        if coding is not None:
            payload = compression.compress(payload, coding)
            headers["content-encoding"] = coding
            headers["vary"] = "accept-encoding"
        return payload, media_type, headers

    async def serve(
        self,
        name: str,
        version: str | None,
        body: Awaitable[bytes],
        decode: Callable[[bytes], InferenceRequest],
        encode: Encoder,
        traceparent: str | None = None,
        watcher: RequestWatcher | None = None,
    ) -> tuple[bytes, str, dict[str, str]]:
        """One inference, however its body is written: (payload, media type, headers); a refusal is raised.
        ``watcher``: another route's (SageMaker's), else the V2 route's."""
        (payload, media_type, encoded), answer, timings = await self.plane.serve(
            watcher or self.watcher, name, version, body, decode, encode, traceparent
        )
        headers = {"server-timing": server_timing(timings, answer.device), **encoded}
        if answer.cache != "off":
            headers["x-fnserve-cache"] = answer.cache
        return payload, media_type, headers


# How an answer is written: (payload, media type, headers of its own).
Encoder = Callable[[Answer, InferenceRequest], tuple[bytes, str, dict[str, str]]]


def encode_v2(answer: Answer, request: InferenceRequest) -> tuple[bytes, str, dict[str, str]]:
    """A V2 answer: JSON, or JSON then binary tensors (with the JSON part's length in a header)."""
    payload, head_length = encode_response(answer.name, answer.version, answer.outputs, request, answer.parameters)
    if head_length is None:
        return payload, JSON, {}
    return payload, BINARY, {JSON_HEADER: str(head_length)}


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """A request's whole body from its ASGI messages, refused past ``limit`` bytes (``declared``: its
    Content-Length); :class:`ClientGone` if the client leaves first. A loop over ``receive``, not an async
    generator (Starlette's ``Request.stream``): asyncio registers and forgets every async generator it runs."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit")
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
            parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _json_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"Inference-Header-Content-Length must be an integer, got {value!r}") from None
