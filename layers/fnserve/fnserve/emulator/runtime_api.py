"""Lambda's Runtime API on loopback, for functions packaged as container images.

An image function is a process that polls ``AWS_LAMBDA_RUNTIME_API`` for events
(``awslambdaric``, or any custom runtime) instead of a module the emulator imports. This
is the service side of that protocol (``/2018-06-01/runtime/...``: next, response, error,
init error), with :meth:`RuntimeApi.invoke` as the caller's side: one event in, the
function's answer (or its error) out, as Lambda's Invoke API gives them.

It runs in a thread of its own (stdlib HTTP server): the runtime long-polls ``next``, and
only one invocation is in flight at a time, as in one Lambda execution environment.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fnserve.aws.events import arn

PREFIX = "/2018-06-01/runtime"


class FunctionError(Exception):
    """The function answered an invocation with an error (Lambda's ``FunctionError: Unhandled``)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('errorType', 'Error')}: {error.get('errorMessage', error)}")
        self.error = error


class InitError(FunctionError):
    """The function failed before it could take an event: its handler did not import (``/init/error``)."""


class RuntimeExited(FunctionError):
    """The function's process is gone (it crashed, or was stopped) while an invocation waited for it."""


@dataclass
class _Invocation:
    request_id: str
    body: bytes
    deadline_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    abandoned: bool = False  # its caller stopped waiting: a runtime that has not taken it never gets it
    payload: bytes | None = None
    error: dict[str, Any] | None = None


class RuntimeApi:
    """The Runtime API for one function on ``host:port`` (0: a free port); ``address`` is what to give the
    function as ``AWS_LAMBDA_RUNTIME_API``."""

    def __init__(
        self, function_name: str = "fnserve-image", host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0
    ) -> None:
        self.function_name = function_name
        self.timeout = timeout
        self._events: queue.Queue[_Invocation] = queue.Queue()
        self._running: dict[str, _Invocation] = {}
        self._lock = threading.Lock()
        self.init_error: dict[str, Any] | None = None  # what the runtime posted to /init/error
        self._initialised = threading.Event()  # the runtime asked for its first event, or reported an init error
        self._exited: str | None = None
        self._host = host
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="runtime-api", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self._host}:{self._server.server_port}"

    def invoke(self, event: Any, timeout: float | None = None) -> Any:
        """Send ``event`` (anything JSON can carry) to the function; its JSON answer, decoded.

        A :class:`FunctionError` when the function reports one, an :class:`InitError` when it could not
        start, a :class:`TimeoutError` when it answers nothing within ``timeout`` (default: the function's).
        """
        try:
            body = json.dumps(event).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a Lambda event must be JSON: {exc}") from None
        limit = self.timeout if timeout is None else timeout
        invocation = _Invocation(str(uuid.uuid4()), body, int((time.time() + limit) * 1000))
        with self._lock:
            self._running[invocation.request_id] = invocation
        self._events.put(invocation)
        deadline = time.monotonic() + limit
        try:
            while not invocation.done.wait(0.05):
                if self.init_error is not None:
                    raise InitError(self.init_error)
                if self._exited is not None:
                    raise RuntimeExited({"errorType": "Runtime.ExitError", "errorMessage": self._exited})
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.function_name} gave no answer within {limit:g} s")
        finally:
            with self._lock:
                self._running.pop(invocation.request_id, None)
                invocation.abandoned = not invocation.done.is_set()
        if invocation.error is not None:
            raise FunctionError(invocation.error)
        assert invocation.payload is not None
        return json.loads(invocation.payload) if invocation.payload else None

    def wait_initialised(self, timeout: float) -> bool:
        """Whether the runtime finished its init (first poll for an event, or an init error) within ``timeout``."""
        return self._initialised.wait(timeout)

    def exited(self, reason: str) -> None:
        """Tell the callers waiting on the function that its process is gone (``reason``): they fail at once."""
        self._exited = reason
        self._initialised.set()

    def close(self) -> None:
        self.exited("the Runtime API closed")
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RuntimeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the runtime's side -----------------------------------------------------------------------

    def _next(self) -> _Invocation:
        self._initialised.set()
        while True:
            invocation = self._events.get()
            with self._lock:
                if not invocation.abandoned:
                    return invocation

    def _finish(self, request_id: str, payload: bytes | None, error: dict[str, Any] | None) -> bool:
        with self._lock:
            invocation = self._running.get(request_id)
        if invocation is None:
            return False
        invocation.payload, invocation.error = payload, error
        invocation.done.set()
        return True

    def _failed_init(self, error: dict[str, Any]) -> None:
        self.init_error = error
        self._initialised.set()


def _error_body(raw: bytes, error_type: str | None) -> dict[str, Any]:
    """The error a runtime posted: its JSON, or what it sent wrapped as one."""
    try:
        error = json.loads(raw) if raw else {}
    except ValueError:
        error = {"errorMessage": raw.decode(errors="replace")}
    if not isinstance(error, dict):
        error = {"errorMessage": str(error)}
    error.setdefault("errorType", error_type or "Unhandled")
    return error


def _handler(api: RuntimeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path != f"{PREFIX}/invocation/next":
                return self._json(404, {"errorType": "NotFound", "errorMessage": f"no route {self.path}"})
            invocation = api._next()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(invocation.body)))
            self.send_header("lambda-runtime-aws-request-id", invocation.request_id)
            self.send_header("lambda-runtime-deadline-ms", str(invocation.deadline_ms))
            self.send_header("lambda-runtime-invoked-function-arn", arn("lambda", f"function:{api.function_name}"))
            self.send_header("lambda-runtime-trace-id", f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]}")
            self.end_headers()
            self.wfile.write(invocation.body)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            parts = self.path.removeprefix(PREFIX).strip("/").split("/")
            if parts == ["init", "error"]:
                api._failed_init(_error_body(raw, self.headers.get("lambda-runtime-function-error-type")))
                return self._json(202, {"status": "OK"})
            if len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
                error = None
                if parts[2] == "error":
                    error = _error_body(raw, self.headers.get("lambda-runtime-function-error-type"))
                if api._finish(parts[1], raw if error is None else None, error):
                    return self._json(202, {"status": "OK"})
                return self._json(
                    400, {"errorType": "InvalidRequestID", "errorMessage": f"no invocation {parts[1]} in flight"}
                )
            self._json(404, {"errorType": "NotFound", "errorMessage": f"no route {self.path}"})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the runtime polls ``next`` for every event."""

    return Handler
