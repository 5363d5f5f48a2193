"""A pool worker's main: import the handler once (the warm globals), then answer invocations.

Runs in a spawned process. The parent decides when workers stop: Ctrl-C or a SIGTERM to the
whole process group must not kill them under it, so they ignore both; if the parent dies
outright, the pipe closes and they exit quietly. A ``console`` worker (the emulator's) sends
what the function prints, line by line, and each invocation's usage (duration, memory, init).
"""

from __future__ import annotations

import contextlib
import importlib
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

from fnserve.aws.events import LambdaContext
from fnserve.core.errors import FnserveError, HandlerError
from fnserve.observability.lines import LineWriter
from fnserve.workers.messages import InitFailed, Invoke, Output, Raised, Ready, Returned, Started, Usage


def worker_main(conn: Connection, spec_json: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = json.loads(spec_json)
    os.environ.update(spec["env"])
    sys.path[:0] = [spec["code_dir"], *spec.get("paths", ())]  # the function's code, then its layers, as Lambda
    console = bool(spec.get("console"))
    send = _locked(conn.send)
    if console:  # before the handler's import: its loggers bind the streams they find then
        sys.stdout = sys.stderr = LineWriter(_output_sender(send))
    memory = Memory(spec["name"], spec["memory_mb"]) if spec.get("memory_limit") else None
    if memory is not None:  # from the start: Lambda's init runs within the function's memory too
        threading.Thread(target=memory.watch, name="memory", daemon=True).start()
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
                try:
                    response = handler(message.event, context)
                finally:
                    if memory is not None:
                        memory.check_peak()
            except FnserveError as exc:
                send(Raised(message.id, exc.to_dict(), _usage(console, began, init_ms, memory)))
            except Exception as exc:  # noqa: BLE001 - a function error, as Lambda reports it
                # Where Lambda's runtime logs it (the function's log, the emulator's console): with its traceback.
                print(f"[ERROR] {type(exc).__name__}: {exc}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                error = HandlerError(f"{type(exc).__name__}: {exc}").to_dict()
                send(Raised(message.id, error, _usage(console, began, init_ms, memory)))
            else:
                send(Returned(message.id, response, _usage(console, began, init_ms, memory)))
            init_ms = None


class Memory:
    """A function's memory as Lambda would count it, from this worker's resident set.

    The worker is a process of the emulator's: before the function's code it holds what the
    emulator's parent process imported (a spawned process imports its parent's main module). That
    is not the function's, so memory is counted from the resident set at the worker's start, plus
    :data:`RUNTIME_MB` for the Python runtime itself (a hello-world Python function's REPORT
    says about 40 MB). Past ``limit_mb`` (the function's MemorySize) the worker stops, as Lambda
    stops a function with ``Runtime.OutOfMemory``: the pool answers the invocation as failed and
    starts a fresh worker, as Lambda starts a fresh environment.
    """

    RUNTIME_MB = 40.0
    CHECK_SECONDS = 0.01  # how often the watch reads it: an allocation past the limit is caught within this

    def __init__(self, name: str, limit_mb: int) -> None:
        self.name, self.limit_mb = name, limit_mb
        self._page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
        self._statm = open("/proc/self/statm", "rb", buffering=0)  # noqa: SIM115 - read for the process's life
        # The peak so far is the emulator's (the spawn's imports): Linux starts it again from here.
        try:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")
            self._high_water = True
        except OSError:  # not allowed here: the peak is the most the watch has seen
            self._high_water = False
        self._base_mb = self._resident() - self.RUNTIME_MB
        self._seen = self.RUNTIME_MB

    def _resident(self) -> float:
        self._statm.seek(0)
        return int(self._statm.read().split()[1]) * self._page_mb

    def peak(self) -> int:
        """The most this function has used so far, in MB (REPORT's Max Memory Used): the resident set's high-water
        mark (VmHWM, started again at the worker's start) over the base, else the most the watch has seen."""
        if not self._high_water:
            return round(max(self._seen, self._resident() - self._base_mb))
        with open("/proc/self/status", "rb") as status:
            line = next(line for line in status if line.startswith(b"VmHWM:"))
        return round(int(line.split()[1]) / 1024 - self._base_mb)  # kB

    def watch(self) -> None:
        """Stop the worker once the function's memory passes its limit (runs on a thread of its own)."""
        while True:
            used = self._resident() - self._base_mb
            self._seen = max(self._seen, used)
            if used > self.limit_mb:
                self._stop(used)
            time.sleep(self.CHECK_SECONDS)

    def check_peak(self) -> None:
        """Stop the worker if a peak the watch did not see (freed within a check) passed the limit."""
        peak = self.peak()
        if peak > self.limit_mb:
            self._stop(peak)

    def _stop(self, used_mb: float) -> None:
        print(
            f"[ERROR] Runtime.OutOfMemory: function {self.name} used {used_mb:.0f} MB, over its MemorySize of "
            f"{self.limit_mb} MB; its worker is stopped, as Lambda stops the function",
            file=sys.stderr,
            flush=True,
        )
        os._exit(137)


def _usage(console: bool, began: float, init_ms: float | None, memory: Memory | None) -> Usage | None:
    if not console:
        return None  # the server's inference workers: nobody reads it
    if memory is not None:
        used = memory.peak()
    else:
        used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # kilobytes on Linux
    return Usage(round((time.perf_counter() - began) * 1e3, 2), used, init_ms)


def _locked(send: Callable[[Any], None]) -> Callable[[Any], None]:
    """``send`` for several threads: a handler may log from its own threads while the loop answers."""
    lock = threading.Lock()

    def locked(message: Any) -> None:
        with lock:
            send(message)

    return locked


def _output_sender(send: Callable[[Any], None]) -> Callable[[str], None]:
    def emit(line: str) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: nobody to show it to
            send(Output(line))

    return emit
