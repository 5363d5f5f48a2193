"""A TCP proxy in front of a real server (moto) that can stall or drop, to play an AWS outage for real.

``forward`` relays bytes both ways; ``stall`` accepts connections and reads requests but
never answers (a DynamoDB that hangs); ``down`` closes every connection at once (an
unreachable endpoint). Switching modes closes the connections open until then, as a real
outage or recovery would.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal
from urllib.parse import urlparse

Mode = Literal["forward", "stall", "down"]


class FaultyProxy:
    """Listens on 127.0.0.1 (``url``) and relays to ``upstream`` while in ``forward`` mode."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.mode: Mode = "forward"
        self.stalled_requests = 0  # requests that arrived while stalled (never answered)
        self.stalled = threading.Event()  # set when the first stalled request arrives
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode: Mode) -> None:
        """Switch mode; connections open until now are closed."""
        with self._lock:
            self.mode = mode
            self.stalled.clear()
            self.stalled_requests = 0
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        self._listener.close()
        self.set("down")

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                mode = self.mode
                if mode != "down":
                    self._open.add(client)
            if mode == "down":
                _close(client)
            elif mode == "stall":
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
            else:
                threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _swallow(self, client: socket.socket) -> None:
        while data := _recv(client):
            with self._lock:
                self.stalled_requests += data.count(b" HTTP/1.1\r\n")
            self.stalled.set()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _close(client)
            return
        with self._lock:
            self._open.add(upstream)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _pump(source: socket.socket, target: socket.socket) -> None:
    while data := _recv(source):
        try:
            target.sendall(data)
        except OSError:
            break
    _close(source)
    _close(target)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@contextmanager
def faulty_proxy(upstream: str) -> Iterator[FaultyProxy]:
    proxy = FaultyProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
