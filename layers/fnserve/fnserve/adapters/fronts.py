"""Several front processes on one port, each with a listening socket of its own.

uvicorn's ``workers`` share one listening socket: every process waits on the same queue of
connections, and the first one awake accepts all that are waiting. A burst of keep-alive
connections (a load balancer's pool, a load generator's) can then land in one process and stay
there while the others idle: with two front processes and wrk's 16 connections, one run in
three had every connection in one process and half the throughput. Here each front process
binds its own socket with ``SO_REUSEPORT`` and the kernel spreads new connections over the
sockets by a hash of their addresses (Linux; elsewhere uvicorn's shared socket is used).

A front process listens only once its models are loaded and warm, so the first to finish
would take every connection opened before the others are up: the server answers ready (HTTP,
SageMaker's ``/ping``, gRPC) only once every front process is listening (:class:`AllListening`).

The parent supervises them as uvicorn's does: SIGINT or SIGTERM stops them gracefully
(requests in flight finish), one that exits is replaced, and one that fails its start stops
the server with uvicorn's start-failure status.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from uvicorn.config import STARTUP_FAILURE

from fnserve.adapters.logs import logger

_spawn = multiprocessing.get_context("spawn")

# Set in a front process before uvicorn builds its app: how many front processes there are, and how many listen.
_listening: tuple[Synchronized[int], int] | None = None


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
    listening right after), counted out when it stops; true once as many as the server has were in at once."""

    def __init__(self, listening: Synchronized[int], processes: int) -> None:
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


def run(app: str, processes: int, options: dict[str, Any]) -> None:
    """Serve the ASGI app factory ``app`` (an import string) from ``processes`` front processes on
    ``options["host"]:options["port"]`` (``options``: uvicorn.Config's), until SIGINT or SIGTERM."""
    if not balanced():
        import uvicorn

        uvicorn.run(app, factory=True, workers=processes, **options)
        return
    # Bound (not listening) for the server's life: a port already taken fails here, at once, and no other program
    # can take it between two front processes' starts.
    held = reuse_port_socket(options["host"], options["port"])
    options = {**options, "port": held.getsockname()[1]}  # port 0: the one the system chose, for every process
    listening: Synchronized[int] = _spawn.Value("i", 0)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}

    def start() -> multiprocessing.process.BaseProcess:
        child = _spawn.Process(target=_front, args=(app, options, listening, processes), daemon=False)
        child.start()
        return child

    children = [start() for _ in range(processes)]
    failed = False
    try:
        while not stop.wait(0.5):
            for i, child in enumerate(children):
                if child.is_alive():
                    continue
                if child.exitcode == STARTUP_FAILURE:
                    logger.error("a front process could not start (its reason is above); stopping the server")
                    failed = True
                    stop.set()
                    break
                logger.warning(f"front process {child.pid} exited with status {child.exitcode}; starting another")
                children[i] = start()
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()  # SIGTERM: uvicorn finishes the requests in flight, then the app's lifespan ends
        for child in children:
            child.join()
        held.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        raise SystemExit(STARTUP_FAILURE)


def _front(app: str, options: dict[str, Any], listening: Synchronized[int], processes: int) -> None:
    """One front process: its own SO_REUSEPORT socket, and uvicorn serving ``app`` on it."""
    import uvicorn

    global _listening
    _listening = (listening, processes)
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), name="fnserve-orphan-watch", daemon=True).start()
    sock = reuse_port_socket(options["host"], options["port"])
    server = uvicorn.Server(uvicorn.Config(app, factory=True, **options))
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _exit_with(parent: int) -> None:
    """Stop this front process, gracefully, if the server's process dies without stopping it (SIGKILL): an
    orphan would keep the port."""
    while os.getppid() == parent:
        time.sleep(1.0)
    logger.warning("the server's process is gone; stopping this front process")
    signal.raise_signal(signal.SIGTERM)
