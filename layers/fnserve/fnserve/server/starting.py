"""A server's port answers while its models load: 503 to every request, health checks included.

SageMaker's ``/ping``, Kubernetes' readiness probes and load balancers then see "not ready" from the
first second of a start that may take minutes (downloads, TensorRT engine builds, warm-up), instead of
connection refused; and a port that another program holds stops the start at once, before any model
is loaded, instead of after the "serving" banner. Where front processes serve the port (SO_REUSEPORT),
they join it while it still answers, and it leaves once they all listen: the port never closes during a start.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fnserve.core.errors import ConfigError
from fnserve.server.fronts import balanced

RETRY_AFTER_SECONDS = 5
BODY = json.dumps({"error": "the server is starting: its models are loading"}).encode()


class _NotReady(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        # The body first: a socket closed with unread bytes is reset, and the client may lose the answer.
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(503)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(BODY)))
        self.send_header("retry-after", str(RETRY_AFTER_SECONDS))
        self.send_header("connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(BODY)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: health checks poll often, and the start log says what is loading."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # the real server binds the port right after this one closes it
    allow_reuse_port = balanced()  # or joins it, front processes on SO_REUSEPORT sockets, before it closes


class _Server6(_Server):
    address_family = socket.AF_INET6


class Starting:
    """The 503 answers of a start, until :meth:`close` (called again, it does nothing)."""

    def __init__(self, server: _Server | None = None, thread: threading.Thread | None = None) -> None:
        self._server, self._thread = server, thread

    def close(self) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is not None and thread is not None:
            server.shutdown()
            thread.join()
            server.server_close()


@contextmanager
def not_ready_until_loaded(host: str, port: int, answer: bool = True) -> Iterator[Starting]:
    """Answer 503 on ``host:port`` until the block ends or the :class:`Starting` it yields is closed, whichever
    comes first; the port is free again after it, but for the SO_REUSEPORT sockets that joined it meanwhile.
    With ``answer`` false, the port is only checked free: it stays closed until the server listens.

    Port 0 (the system picks one) is left alone: nothing could know which port to probe yet.
    A port already held stops the start with a :class:`ConfigError` saying so.
    """
    if port == 0:
        yield Starting()
        return
    # A plain bind first: another server on SO_REUSEPORT sockets would otherwise be joined, not refused.
    refuse_taken(host, port, "")
    if not answer:
        yield Starting()
        return
    server_class = _Server6 if ":" in host else _Server
    try:
        server = server_class((host, port), _NotReady)
    except OSError as exc:
        raise _refusal("", host, port, exc) from None
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="fnserve-starting")
    thread.start()
    starting = Starting(server, thread)
    try:
        yield starting
    finally:
        starting.close()


def refuse_taken(host: str, port: int, what: str) -> None:
    """Stop a start at once when another program listens on ``host:port`` (``what`` names it: "gRPC", "the
    gateway's").

    Probed with a plain bind, not ``SO_REUSEPORT``: gRPC sets that option by default, and a second server
    would otherwise join the first one's port and split its traffic, each answering for its own models.
    A previous run's connections in TIME_WAIT do not count (``SO_REUSEADDR``). Port 0 is never taken.
    """
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise _refusal(what, host, port, exc) from None


def _refusal(what: str, host: str, port: int, exc: OSError) -> ConfigError:
    named = f"{what} port" if what else "port"
    if exc.errno == errno.EADDRINUSE:
        holder = port_holder(port)
        by = f"{holder}" if holder else "another program"
        return ConfigError(f"{named} {port} on {host} is in use by {by}: pick another one")
    return ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def port_holder(port: int) -> str | None:
    """The process listening on TCP ``port``, as "pid N (its command)", where /proc shows it (Linux, a process
    this user may read); None otherwise."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:  # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                command = " ".join((entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())
                return f"pid {entry.name} ({command[:120]})"
        except OSError:
            continue
    return None
