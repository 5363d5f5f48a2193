"""The V2 inference route over HTTP: a request's body decoded (V2 JSON, or Triton's binary tensor extension),
its answer encoded, with the request id, ``Server-Timing`` and cache headers; the rest is the
envelope every transport shares (:meth:`fnserve.core.serving.dataplane.DataPlane.serve`).

Inference requests take a shorter road than the other routes: :class:`V2App` answers them as
plain ASGI, before Starlette's middleware stack, router and FastAPI's dependency solving (which cost more
than a small model's own run), with the same request id, errors, headers, log line and metrics as the
FastAPI route.
"""

from __future__ import annotations

import functools
import importlib
import threading
import types
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from fnserve.adapters.http import compression
from fnserve.adapters.http.table import JSON_APIS, Route, fast_route
from fnserve.adapters.http.wire import (
    answered,
    error_parts,
    header_request_id,
    request_id,
    respond,
    unnamed_request_id,
)
from fnserve.core.codec.tensors import JSON_HEADER, InferenceRequest, decode_request, encode_response
from fnserve.core.errors import BadRequest, ClientGone, FnserveError, PayloadTooLarge
from fnserve.core.serving.dataplane import Answer, DataPlane
from fnserve.observability.envelope import RequestRecorder, Telemetry
from fnserve.observability.logs import logger, request_keys
from fnserve.observability.request_meta import server_timing
from fnserve.settings import Settings

if TYPE_CHECKING:  # the routes under a root_path: FastAPI's, never on a cold start's road
    from starlette.requests import Request
    from starlette.responses import Response

    from fnserve.adapters.http.gate import Gate

ASGIMessage = MutableMapping[str, Any]  # as Starlette and Mangum type them
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]

ASGIApp = Callable[[ASGIMessage, Receive, Send], Awaitable[None]]

JSON = "application/json"
BINARY = "application/octet-stream"


class JSONRoutes(Protocol):
    """A JSON API's routes (OpenAI's, Cohere's, text-embeddings-inference's): each endpoint of the route table's
    group a method ``(scope, receive, send, **path_parameters)`` answering over ASGI."""

    def __getattr__(self, endpoint: str) -> Callable[..., Awaitable[None]]: ...


class Companion(Protocol):
    """What the app's lifespan starts and stops beside it, on its event loop (the gRPC server, metrics, timers)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# Health checks answered here too: a load balancer's or a platform's probes come often, and the first of a
# server's start should not wait for FastAPI. Each endpoint's answer: the live one always, the others once ready.
HEALTH = {"v2.live": False, "v2.ready": True, "sagemaker.ping": True}


class V2App:
    """The V2 API over ASGI: ``POST /v2/models/{name}[/versions/{v}]/infer`` and the health checks answered here,
    the rest by FastAPI; the lifespan (a server's) starts the ``companions`` and stops them, then closes the data
    plane and runs ``on_shutdown``."""

    def __init__(
        self,
        inference: InferenceRoute,
        routes: Callable[[], ASGIApp],
        companions: Sequence[Companion] = (),
        on_shutdown: Callable[[], None] | None = None,
        apis: Mapping[str, Callable[[], JSONRoutes]] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.inference = inference
        self.gate = gate  # the API keys' check before any route, where keys are set
        self.routes = routes  # builds the app of the other routes
        self.state = types.SimpleNamespace()  # what the process keeps beside the app (the server's pool)
        self._companions, self._on_shutdown = companions, on_shutdown
        self._fastapi: ASGIApp | None = None
        self.apis = dict(apis or {})  # the JSON APIs' routes by the table's group, each made when first called
        self._building = threading.Lock()
        self._build_ahead = False  # a server's: build FastAPI in a thread once the first answer is out
        # What else a server leaves until then: run at once, in the event loop (quick: the other front processes
        # told to start, say), and in that thread after FastAPI (the heap frozen, say).
        self.at_first_answer: list[Callable[[], None]] = []
        self.after_first_answer: list[Callable[[], None]] = []

    def fastapi(self) -> ASGIApp:
        """The FastAPI app of the other routes, built on first use (or ahead, in a thread, by a server once it has
        answered its first inference)."""
        if self._fastapi is None:
            with self._building:  # once, whether the server's thread or a request builds it
                if self._fastapi is None:
                    self._fastapi = self.routes()
        return self._fastapi

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and self.gate is not None and not await self.gate.admitted(scope, send):
            return
        if kind == "http" and not scope.get("root_path"):
            method, path = scope["method"], scope["path"]
            if method == "POST":
                parts = path.split("/")
                # ["", "v2", "models", name, "infer"] or [..., name, "versions", version, "infer"]
                if parts[-1] == "infer" and parts[1:3] == ["v2", "models"] and all(parts[3:-1]):
                    if len(parts) == 5:
                        await self.inference.infer_asgi(scope, receive, send, parts[3], None)
                        return self._answered()
                    if len(parts) == 7 and parts[4] == "versions":
                        await self.inference.infer_asgi(scope, receive, send, parts[3], parts[5])
                        return self._answered()
            found = fast_route(method, path)
            if found is not None and await self._fast(found[0], found[1], scope, receive, send):
                return
        elif kind == "lifespan":
            await self._lifespan(receive, send)
            return
        await (self._fastapi or self.fastapi())(scope, receive, send)

    async def _fast(
        self, route: Route, parameters: dict[str, str], scope: ASGIMessage, receive: Receive, send: Send
    ) -> bool:
        """A fast route of the table answered here (False: FastAPI answers it)."""
        if route.endpoint in HEALTH:
            await self._health(scope, send, HEALTH[route.endpoint])
            return True
        api = self.apis.get(route.group)
        if api is None:
            return False
        await getattr(api(), route.attribute)(scope, receive, send, **parameters)
        if route.method == "POST":
            self._answered()
        return True

    def _answered(self) -> None:
        # FastAPI's imports take the GIL for a quarter of a second: built while a cold start's first request is
        # in flight, they would delay its answer, which is what the platform holding that request waits for.
        if self._build_ahead:
            self._build_ahead = False
            for then in self.at_first_answer:
                then()
            threading.Thread(target=self._ahead, name="fnserve-routes", daemon=True).start()

    def _ahead(self) -> None:
        self.fastapi()
        for then in self.after_first_answer:
            then()

    async def _health(self, scope: ASGIMessage, send: Send, readiness: bool) -> None:
        """``{"live": true}``, or ``{"ready": ...}`` with 200 or 503, as the FastAPI routes answer them."""
        ready = self.inference.plane.catalog.ready() if readiness else True
        body = (b'{"ready":true}' if ready else b'{"ready":false}') if readiness else b'{"live":true}'
        status = 200 if ready else 503
        headers = [(b"content-length", str(len(body)).encode()), (b"content-type", JSON.encode())]
        headers.append((b"x-request-id", request_id(scope).encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        answered(scope, status)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """ASGI's lifespan: the companions started, and FastAPI built in a thread once the server has answered its
        first inference (inference and health checks need none); at shutdown the companions stopped (last started,
        first), the data plane closed, then ``on_shutdown``."""
        await receive()  # lifespan.startup
        started: list[Companion] = []
        try:
            for companion in self._companions:
                await companion.start()
                started.append(companion)
        except Exception as exc:  # noqa: BLE001 - uvicorn reports the message and stops the start
            logger.exception("the server's start failed")
            await self._stop(started)
            await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
            return
        self._build_ahead = True
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await self._stop(started)
        await send({"type": "lifespan.shutdown.complete"})

    async def _stop(self, started: list[Companion]) -> None:
        try:
            for companion in reversed(started):
                await companion.stop()
        finally:
            await self.inference.plane.close()
            if self._on_shutdown is not None:
                self._on_shutdown()


class InferenceRoute:
    """The inference route's work, whichever road a request took: decode, infer, encode, log, record."""

    def __init__(self, plane: DataPlane, settings: Settings, telemetry: Telemetry) -> None:
        self.plane = plane
        self.recorder = RequestRecorder("http", telemetry, access_log=settings.access_log)
        self.limit = settings.max_request_bytes
        self.max_wait = settings.max_wait_seconds
        self.default_model = settings.default_model
        self.tei_model = settings.tei_model

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
        request = V2Request(name, version, traceparent, receive, declared, self.limit, json_length, encoding)
        headers: dict[str, str]
        try:
            served = self.plane.serve(self.recorder, request)  # an overloaded model refuses here, its body unread
            payload, media_type, headers = self.http_response(await served, accept)
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
        await respond(scope, send, status, payload, media_type, headers, rid)

    async def answer(
        self, request: V2Request, recorder: RequestRecorder | None = None, accept: str | None = None
    ) -> tuple[bytes, str, dict[str, str]]:
        """One inference, however its body is written: (payload, media type, headers); a refusal is raised.
        ``recorder``: another route's (SageMaker's), else the V2 route's; ``accept``: the Accept-Encoding the
        answer may use."""
        return self.http_response(await self.plane.serve(recorder or self.recorder, request), accept)

    def http_response(
        self, served: tuple[tuple[bytes, str, dict[str, str]], Answer, dict[str, float]], accept: str | None
    ) -> tuple[bytes, str, dict[str, str]]:
        """A served request's payload, media type and headers: its own, Server-Timing, the cache's, compression."""
        (payload, media_type, encoded), answer, timings = served
        headers = {"server-timing": server_timing(timings, answer.device), **encoded}
        if answer.cache != "off":
            headers["x-fnserve-cache"] = answer.cache
        coding = compression.accepted(accept)
        if coding is not None:
            payload = compression.compress(payload, coding)
            headers["content-encoding"] = coding
            headers["vary"] = "accept-encoding"
        return payload, media_type, headers


def json_apis(inference: InferenceRoute) -> dict[str, Callable[[], JSONRoutes]]:
    """The JSON APIs' routes over ``inference``'s data plane by the route table's group, each made when first called
    (its pipelines found in the manifest then)."""

    def made(module: str, name: str) -> Callable[[], JSONRoutes]:
        @functools.cache
        def routes() -> JSONRoutes:
            return getattr(importlib.import_module(module), name)(inference)  # type: ignore[no-any-return]

        return routes

    return {group: made(*where) for group, where in JSON_APIS.items()}


class V2Request:
    """A V2 inference over HTTP, as the data plane takes it: its body read only once the request is admitted
    (refused past ``limit`` bytes), decompressed, then decoded as V2 JSON or Triton's binary tensor extension;
    its answer encoded likewise. Subclasses decode and encode other formats (SageMaker's NumPy bodies)."""

    __slots__ = ("name", "version", "traceparent", "_receive", "_declared", "_limit", "_json_length", "_coding", "_v2")
    deadline = None  # an HTTP caller's wait is not told before the body (the body's own "timeout" parameter is)

    def __init__(
        self,
        name: str,
        version: str | None,
        traceparent: str | None,
        receive: Receive,
        declared: str | None,
        limit: int,
        json_length: str | None = None,
        coding: str | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.traceparent = traceparent
        self._receive = receive
        self._declared = declared  # Content-Length
        self._limit = limit
        self._json_length = json_length  # Inference-Header-Content-Length
        self._coding = coding  # Content-Encoding
        self._v2: InferenceRequest | None = None

    async def decoded(self) -> InferenceRequest:
        raw = await read_body(self._receive, self._declared, self._limit)
        if self._coding is not None:  # the binary extension's JSON length counts the decompressed body, as Triton's
            raw = compression.decompress(raw, self._coding, self._limit)
        self._v2 = self.decode(raw)
        return self._v2

    def decode(self, raw: bytes) -> InferenceRequest:
        return decode_request(raw, _json_length(self._json_length))

    def encode(self, answer: Answer) -> tuple[bytes, str, dict[str, str]]:
        assert self._v2 is not None, "encoded before it was decoded"
        return encode_v2(answer, self._v2)


def encode_v2(answer: Answer, request: InferenceRequest) -> tuple[bytes, str, dict[str, str]]:
    """A V2 answer: JSON, or JSON then binary tensors (with the JSON part's length in a header)."""
    payload, head_length = encode_response(answer.name, answer.version, answer.outputs, request, answer.parameters)
    if head_length is None:
        return payload, JSON, {}
    return payload, BINARY, {JSON_HEADER: str(head_length)}


def request_headers(scope: ASGIMessage, wanted: frozenset[bytes]) -> tuple[str, dict[bytes, str]]:
    """A JSON API request's id (its X-Request-Id, else the Lambda request's or a new one; set on its log lines) and
    those of the ``wanted`` headers it brought."""
    rid = None
    found: dict[bytes, str] = {}
    for key, value in scope["headers"]:
        if key in wanted:
            found[key] = value.decode("latin-1")
        elif key == b"x-request-id" and value and rid is None:
            rid = header_request_id(value)
    rid = rid or unnamed_request_id(scope)
    request_keys(request_id=rid)
    return rid, found


async def respond_json(
    scope: ASGIMessage,
    send: Send,
    rid: str,
    answer: Callable[[], Awaitable[tuple[bytes, dict[str, str]]]],
    errors: Callable[[FnserveError], tuple[int, bytes, dict[str, str]]],
) -> None:
    """A JSON API's ``answer`` (its body and headers), or its error in the API's own shape (``errors``); a client
    that left gets nothing."""
    try:
        payload, headers = await answer()
        status = 200
    except FnserveError as exc:
        status, payload, headers = errors(exc)
    except ClientGone:
        return
    except Exception:  # reading the body failed in a way no error of fnserve's says
        logger.exception("unhandled error", extra={"path": scope.get("path")})
        status, payload, headers = errors(FnserveError("internal server error"))
    await respond(scope, send, status, payload, JSON, headers, rid)


async def responded(request: Request, route: Callable[[Send], Awaitable[None]]) -> Response:
    """What a route sends, as one Starlette response."""
    from starlette.responses import Response

    sent: dict[str, Any] = {}

    async def send(message: ASGIMessage) -> None:
        sent.update(message)

    await route(send)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in sent.get("headers", ())}
    headers.pop("content-length", None)
    return Response(sent.get("body", b""), sent.get("status", 500), headers, media_type=None)


def json_object(raw: bytes, refuse: Callable[[str], FnserveError]) -> dict[str, Any]:
    """A JSON API's body as the object it must be; else ``refuse``'s error (the API's own shape) saying what it is."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise refuse(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise refuse("the body must be a JSON object")
    return doc


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
