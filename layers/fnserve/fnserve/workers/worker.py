"""A pool worker's main: import the handler once (the warm globals), then answer invocations.

Runs in a spawned process. The parent decides when workers stop: Ctrl-C or a SIGTERM to the
whole process group must not kill them under it, so they ignore both; if the parent dies
outright, the pipe closes and they exit quietly. A ``console`` worker (the emulator's) sends
what the function prints, line by line, and each invocation's usage (duration, memory, init).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from fnserve.adapters.local.events import LambdaContext
from fnserve.core.errors import FnserveError, HandlerError
from fnserve.workers.messages import InitFailed, Invoke, Output, Raised, Ready, Returned, Started, Usage


def worker_main(conn: Connection, spec_json: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = json.loads(spec_json)
    os.environ.update(spec["env"])
    sys.path.insert(0, spec["code_dir"])
    console = bool(spec.get("console"))
    send = _locked(conn.send)
    if console:  # before the handler's import: its loggers bind the streams they find then
        sys.stdout = sys.stderr = LineWriter(_output_sender(send))
    module_name, _, attribute = spec["handler"].rpartition(".")
    began = time.perf_counter()
    try:
        handler = getattr(importlib.import_module(module_name), attribute)  # warm globals: built once
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which keeps running
        reason = exc.message if isinstance(exc, FnserveError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            send(InitFailed(f"{spec['handler']} failed to initialise: {reason}"))
        return
    init_ms: float | None = (time.perf_counter() - began) * 1e3
    with contextlib.suppress(EOFError, OSError):  # the pipe closes when the parent goes away: exit quietly
        send(Ready())
        message: Invoke | None
        while (message := conn.recv()) is not None:
            send(Started(message.id))
            context = LambdaContext(message.id, spec["name"], spec["memory_mb"], message.timeout)
            began = time.perf_counter()
            try:
                response = handler(message.event, context)
            except FnserveError as exc:
                send(Raised(message.id, exc.to_dict(), _usage(console, began, init_ms)))
            except Exception as exc:  # noqa: BLE001 - a function error, as Lambda reports it
                # Where Lambda's runtime logs it (the function's log, the emulator's console): with its traceback.
                print(f"[ERROR] {type(exc).__name__}: {exc}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                error = HandlerError(f"{type(exc).__name__}: {exc}").to_dict()
                send(Raised(message.id, error, _usage(console, began, init_ms)))
            else:
                send(Returned(message.id, response, _usage(console, began, init_ms)))
            init_ms = None


def _usage(console: bool, began: float, init_ms: float | None) -> Usage | None:
    if not console:
        return None  # the server's inference workers: nobody reads it
    max_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    return Usage(round((time.perf_counter() - began) * 1e3, 2), max_rss_kb // 1024, init_ms)


def _locked(send: Callable[[Any], None]) -> Callable[[Any], None]:
    """``send`` for several threads: a handler may log from its own threads while the loop answers."""
    lock = threading.Lock()

    def locked(message: Any) -> None:
        with lock:
            send(message)

    return locked


class LineWriter(io.TextIOBase):
    """A writable text stream that hands each complete line to ``emit`` (a console worker's stdout)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self.write("\n")


def _output_sender(send: Callable[[Any], None]) -> Callable[[str], None]:
    def emit(line: str) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: nobody to show it to
            send(Output(line))

    return emit
