"""Several front processes on one port, each with a listening socket of its own.

uvicorn's ``workers`` share one listening socket: every process waits on the same queue of
connections, and the first one awake accepts all that are waiting. A burst of keep-alive
connections (a load balancer's pool, a load generator's) can then land in one process and stay
there while the others idle, the server then serving at one process's pace
(docs/design/server-layout.md). Here each front process binds its own socket with ``SO_REUSEPORT``
and the kernel spreads new connections over the sockets by a hash of their addresses (Linux;
elsewhere uvicorn's shared socket is used).

A front process listens only once its models are loaded and warm, so the first to finish
would take every connection opened before the others are up: the server answers ready (HTTP,
SageMaker's ``/ping``, gRPC) only once every front process is listening (:class:`AllListening`).

The parent supervises them: SIGINT or SIGTERM stops them gracefully (requests in flight finish).
One that exits after it listened is replaced, at once, then after a doubling delay while its
replacements keep dying soon after their start. One that dies before it ever listened is started
again, but :data:`START_ATTEMPTS` of those in a row (or one with uvicorn's start-failure status)
stop the server with the last one's error, as gunicorn stops on "Worker failed to boot": a front
process that cannot start would otherwise be restarted for ever, the server never ready, never
exiting. Each child logs its own error with its traceback, and sends it to the parent.

A fast start (:func:`serve_first`) makes the parent the first front process: the first request then waits for one
interpreter's start, not for a supervisor's and then a front process's; the others are supervised from a thread,
and start once the first has answered (no multiprocessing object is made before).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn

from fnserve.core.errors import FnserveError, HandlerError
from fnserve.observability.logs import logger

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import SpawnContext
    from multiprocessing.process import BaseProcess
    from multiprocessing.sharedctypes import Synchronized

# uvicorn's exit status for a server that could not start (its own constant moved between releases).
STARTUP_FAILURE = 3

OTHERS_AFTER_S = 2.0  # a fast start's other front processes start once the first has answered, or this long after
# it listens with no request: started at once, they would take a CPU from the first request a platform holds


class Count(Protocol):
    """How many front processes listen: shared with them (a ``multiprocessing.Value``), or this process's alone."""

    value: int

    def get_lock(self) -> Any: ...


class _OwnCount:
    """A :class:`Count` for this process alone. A fast start's first front process counts itself with one: a shared
    Value's semaphore would start multiprocessing's resource tracker, a third interpreter, before the first answer."""

    def __init__(self, value: int) -> None:
        self.value = value
        self._lock = threading.Lock()

    def get_lock(self) -> threading.Lock:
        return self._lock


@functools.cache
def _spawn() -> SpawnContext:
    import multiprocessing  # here: what a fast start's first answer needs does not import it

    return multiprocessing.get_context("spawn")


# Set in a front process before uvicorn builds its app: how many front processes listen, and how many make it ready.
_listening: tuple[Count, int] | None = None


def balanced() -> bool:
    """Whether the kernel balances connections over SO_REUSEPORT sockets here (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with SO_REUSEPORT, not yet listening."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


class AllListening:
    """A front process's share of the server's readiness: counted in when its server starts (uvicorn starts
    listening right after), counted out when it stops; true once as many as the server waits for (all of them, or
    the first of a fast start) were in at once."""

    def __init__(self, listening: Count, processes: int) -> None:
        self._listening, self._processes = listening, processes
        self._all = False

    async def start(self) -> None:
        with self._listening.get_lock():
            self._listening.value += 1

    async def stop(self) -> None:
        with self._listening.get_lock():
            self._listening.value -= 1

    def __call__(self) -> bool:
        # Once all were up the server stays ready: a process replaced later leaves the others serving.
        self._all = self._all or self._listening.value >= self._processes
        return self._all


STATISTICS_DIR_ENV = "FNSERVE_STATISTICS_DIR"  # where front processes share their statistics (the server makes it)
SHARE_SECONDS = 0.1  # how old another front process's figures may be in a statistics answer


def all_listening() -> AllListening | None:
    """This front process's :class:`AllListening`, when it is one of several run by :func:`run`."""
    return AllListening(*_listening) if _listening is not None else None


START_ATTEMPTS = 3  # processes in a row that die before they serve, before the server stops: one killed while
# every process loads at once may do better the next time, a fault that stays stops the server in seconds
FIRST_DELAY, MAX_DELAY = 1.0, 30.0  # a front process dying again soon after its replacement: the next one waits
STEADY_SECONDS = 60.0  # one that lived this long died of something new: its replacement starts at once

# This process's uvicorn server while it serves, and the error fail() stops it with.
_server: uvicorn.Server | None = None
_failure: FnserveError | None = None


class _Server(uvicorn.Server):
    """uvicorn's server, saying when it listens (``on_serving``), and stopped by :func:`fail`."""

    def __init__(self, config: uvicorn.Config, on_serving: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_serving = on_serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_serving is not None:
            self._on_serving()
        if _failure is not None:  # failed while the app started
            self.should_exit = True


def _run(server: _Server, sockets: list[socket.socket] | None = None) -> None:
    global _server
    _server = server
    try:
        server.run(sockets=sockets)
    finally:
        _server = None


def fail(error: FnserveError) -> None:
    """Stop this process's server for good, requests in flight finished, and have it exit with ``error``: a part
    it cannot serve without (its inference workers) cannot start again. Safe from any thread."""
    global _failure
    _failure = error
    logger.error(f"{error.message}; stopping the server")
    if _server is not None:
        _server.should_exit = True


def serve(app: Any, options: dict[str, Any]) -> None:
    """Serve the ASGI ``app`` from this process alone until SIGINT or SIGTERM; raise the error :func:`fail` stopped
    it with, if any."""
    _run(_Server(uvicorn.Config(app, **options)))
    if _failure is not None:
        raise _failure


@dataclass(eq=False)
class _Child:
    process: BaseProcess
    served: Synchronized[int]  # set once it listens
    reason: Connection  # its start error, when it could send it
    began: float
    seen: bool = False  # seen serving by the supervisor


def run(
    app: str,
    processes: int,
    options: dict[str, Any],
    on_replaced: Callable[[], None] | None = None,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve the ASGI app factory ``app`` (an import string) from ``processes`` front processes on
    ``options["host"]:options["port"]`` (``options``: uvicorn.Config's), until SIGINT or SIGTERM; ``on_replaced``
    is called for each one replaced after it served, ``on_listening`` once all the first ones listen (before they
    start, where the port cannot be shared). Raises :class:`HandlerError` when they cannot start. A fast start
    serves from this process first instead (:func:`serve_first`).
    """
    if not balanced():
        if on_listening is not None:
            on_listening()
        uvicorn.run(app, factory=True, workers=processes, **options)
        return
    # Bound (not listening) for the server's life: a port already taken fails here, at once, and no other program
    # can take it between two front processes' starts.
    held = reuse_port_socket(options["host"], options["port"])
    options = {**options, "port": held.getsockname()[1]}  # port 0: the one the system chose, for every process
    listening = _listening_count(on_listening)
    stop = threading.Event()
    try:
        with _stopped_by_signals(stop):
            failed = _Fronts(app, options, listening, processes, stop).supervise(processes, on_replaced, on_listening)
    finally:
        held.close()
    if failed is not None:
        raise failed


def _listening_count(on_listening: Callable[[], None] | None) -> Synchronized[int]:
    """The count of front processes listening, shared with them. With a server answering 503 on the port during
    the start (``on_listening`` closes it), they answer ready only once it has left: counted as one more process to
    wait for, until it is closed."""
    return _spawn().Value("i", _uncounted(on_listening))


def _uncounted(on_listening: Callable[[], None] | None) -> int:
    return 0 if on_listening is None else -1


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` instead of ending this process, for the block; the handlers before after it."""
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def become_first_front(on_listening: Callable[[], None] | None) -> Count:
    """Make this process the first front process of a fast start (:func:`serve_first`): its app, built next,
    answers ready once it listens, with the 503 server gone when there is one (``on_listening`` given)."""
    global _listening
    listening = _OwnCount(_uncounted(on_listening))
    _listening = (listening, 1)
    return listening


def serve_first(
    app: Any,
    factory: str,
    processes: int,
    options: dict[str, Any],
    listening: Count,
    on_replaced: Callable[[], None] | None = None,
    on_listening: Callable[[], None] | None = None,
    at_first_answer: Callable[[Callable[[], None]], None] | None = None,
) -> None:
    """A fast start's front processes, this one first: it serves ``app`` itself (built after
    :func:`become_first_front`), so the first request waits for no second interpreter to start and import; once it
    listens, ``on_listening`` is called, and the other ``processes - 1`` (the app factory ``factory``) start and join
    the port, supervised from a thread as :func:`run` supervises them: once it has answered, when ``at_first_answer``
    registers a callback the app calls then (else at once), or :data:`OTHERS_AFTER_S` after it listens with no answer.
    Until SIGINT or SIGTERM; a front process that cannot start, or this one's failure, stops the server with its error
    (:class:`HandlerError`)."""
    held = reuse_port_socket(options["host"], options["port"])  # the port, for the server's life (as run())
    options = {**options, "port": held.getsockname()[1]}
    served, first_answered, stop = threading.Event(), threading.Event(), threading.Event()
    if at_first_answer is None:
        first_answered.set()
    else:
        at_first_answer(first_answered.set)
    server = _Server(uvicorn.Config(app, **options), served.set)

    def beside() -> None:
        served.wait()  # set at its stop too
        if stop.is_set():
            return
        if on_listening is not None:
            on_listening()
            with listening.get_lock():
                listening.value += 1
        if processes > 1:
            first_answered.wait(OTHERS_AFTER_S)
            if stop.is_set():
                return
            # Their own count: they are each ready once they listen, as this one is.
            others = _Fronts(factory, options, _listening_count(None), 1, stop)
            failed = others.supervise(processes - 1, on_replaced, None)
            if failed is not None:
                fail(failed)

    supervisor = threading.Thread(target=beside, name="fnserve-fronts", daemon=True)
    supervisor.start()
    # uvicorn takes SIGINT and SIGTERM while it serves, then raises the one it got again with the handlers it found:
    # these, so the others are stopped gracefully here instead of this process dying of the signal.
    with _stopped_by_signals(stop):
        try:
            _run(server, [reuse_port_socket(options["host"], options["port"])])
        finally:
            stop.set()
            served.set()
            first_answered.set()
            supervisor.join()
            held.close()
    if _failure is not None:
        raise _failure
    if not server.started:
        raise HandlerError("the server did not start: its error is above")


@dataclass
class _Fronts:
    """Front processes of the app factory ``app`` on ``options``' port, started and replaced until ``stop``."""

    app: str
    options: dict[str, Any]
    listening: Synchronized[int]
    ready_at: int
    stop: threading.Event

    def start(self) -> _Child:
        spawn = _spawn()
        served: Synchronized[int] = spawn.Value("b", 0)
        reason, send = spawn.Pipe(duplex=False)
        process = spawn.Process(
            target=_front,
            args=(self.app, self.options, self.listening, self.ready_at, served, send, os.getpid()),
            daemon=False,
        )
        process.start()
        send.close()
        return _Child(process, served, reason, time.monotonic())

    def supervise(
        self,
        processes: int,
        on_replaced: Callable[[], None] | None,
        on_listening: Callable[[], None] | None,
    ) -> HandlerError | None:
        """Run ``processes`` of them until ``stop``, then stop them; the error that stopped them, if one did."""
        start, stop, listening, ready_at = self.start, self.stop, self.listening, self.ready_at
        children: list[_Child | None] = [start() for _ in range(processes)]
        due = [0.0] * processes  # when each empty slot's replacement starts
        delays = [0.0] * processes  # each slot's delay before its next replacement, if that one dies soon too
        failures = 0  # front processes in a row that died before they listened
        failed: HandlerError | None = None
        try:
            # Often while the first ones start: the 503 server leaves as soon as they all listen.
            while failed is None and not stop.wait(0.01 if on_listening is not None else 0.2):
                now = time.monotonic()
                for i, child in enumerate(children):
                    if child is None:
                        if now >= due[i]:
                            children[i] = start()
                        continue
                    if child.served.value and not child.seen:
                        child.seen, failures = True, 0
                        if on_listening is not None and sum(c is not None and c.seen for c in children) >= ready_at:
                            on_listening()
                            on_listening = None
                            with listening.get_lock():
                                listening.value += 1
                    if child.process.is_alive():
                        continue
                    pid, code, why = child.process.pid, child.process.exitcode, _start_error(child)
                    child.reason.close()
                    if not child.served.value:
                        failures += 1
                        if code == STARTUP_FAILURE or failures >= START_ATTEMPTS:
                            failed = HandlerError(
                                f"front processes failed to start {failures} time(s) in a row, the last "
                                f"(pid {pid}) with status {code}: {why or 'its error is above'}"
                            )
                            break
                        logger.warning(
                            f"front process {pid} exited with status {code} before it listened "
                            f"({why or 'its error is above'}); starting another ({failures} of {START_ATTEMPTS} tries)"
                        )
                        children[i] = start()
                        continue
                    delay = 0.0 if now - child.began >= STEADY_SECONDS else delays[i]
                    delays[i] = min(MAX_DELAY, max(FIRST_DELAY, 2 * delay))
                    logger.warning(
                        f"front process {pid} exited with status {code}{f' ({why})' if why else ''}; starting another"
                        + (f" in {delay:g}s (its predecessor died soon after its start too)" if delay else "")
                    )
                    if on_replaced is not None:
                        on_replaced()
                    children[i], due[i] = None, now + delay
        finally:
            alive = [child for child in children if child is not None]
            for child in alive:
                if child.process.is_alive():
                    child.process.terminate()  # SIGTERM: requests in flight finish, then the lifespan ends
            for child in alive:
                child.process.join()
                child.reason.close()
        return failed


def _start_error(child: _Child) -> str | None:
    """What a front process that died said of its start error, if it could."""
    with contextlib.suppress(EOFError, OSError):
        if child.reason.poll():
            said: str = child.reason.recv()
            return said
    return None


def _front(
    app: str,
    options: dict[str, Any],
    listening: Synchronized[int],
    ready_at: int,
    served: Synchronized[int],
    reason: Connection,
    parent: int,
) -> None:
    """One front process: its own SO_REUSEPORT socket, and uvicorn serving ``app`` on it; its start error, if it
    has one, logged and sent to the parent (``reason``)."""
    global _listening
    _listening = (listening, ready_at)
    # The supervisor's pid as it started this process: read here, it would be init's already if the supervisor
    # died while this one was importing, and an orphan would keep serving the port.
    threading.Thread(target=_exit_with, args=(parent,), name="fnserve-orphan-watch", daemon=True).start()
    sock = reuse_port_socket(options["host"], options["port"])
    server = _Server(uvicorn.Config(app, factory=True, **options), functools.partial(setattr, served, "value", 1))
    try:
        _run(server, [sock])
    except Exception as exc:  # noqa: BLE001 - the app's import or factory: the parent reports it
        said = f"{type(exc).__name__}: {exc}"
        logger.exception(f"front process {os.getpid()} stopped: {said}")
        with contextlib.suppress(OSError):
            reason.send(said)
        sys.exit(1)
    if _failure is not None:
        with contextlib.suppress(OSError):
            reason.send(_failure.message)
        sys.exit(1)
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _exit_with(parent: int) -> None:
    """Stop this front process, gracefully, if the server's process dies without stopping it (SIGKILL): an
    orphan would keep the port."""
    while os.getppid() == parent:
        time.sleep(1.0)
    logger.warning("the server's process is gone; stopping this front process")
    signal.raise_signal(signal.SIGTERM)
