"""The server's HTTP protocol: a response's writes leave in one send (fnserve.adapters.http.protocol)."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn

from fnserve.adapters.http.protocol import HELD_BYTES, Coalescing, HttpProtocol
from fnserve.adapters.http.wire import SEND_NOW


class Recording:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_the_writes_of_one_turn_leave_together_at_its_end() -> None:
    loop = asyncio.new_event_loop()
    try:
        sent = Recording()
        transport = Coalescing(sent, loop)  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"body")
        assert sent.writes == []
        assert transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")
        loop.run_until_complete(asyncio.sleep(0))  # the turn ends
        assert sent.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        transport.write(b"next")
        loop.run_until_complete(asyncio.sleep(0))
        assert sent.writes[1:] == [b"next"]
    finally:
        loop.close()


def test_much_at_once_is_written_at_once_and_close_sends_what_is_held() -> None:
    loop = asyncio.new_event_loop()
    try:
        sent = Recording()
        transport = Coalescing(sent, loop)  # type: ignore[arg-type]
        big = b"x" * (HELD_BYTES + 1)
        transport.write(b"head")
        transport.write(big)  # the transport's own buffer and flow control see it now
        assert sent.writes == [b"head" + big]
        transport.write(b"last")
        transport.close()
        assert sent.writes[1:] == [b"last"] and sent.closed
        aborted = Recording()
        transport = Coalescing(aborted, loop)  # type: ignore[arg-type]
        transport.write(b"dropped")
        transport.abort()
        loop.run_until_complete(asyncio.sleep(0))
        assert aborted.writes == [] and aborted.aborted
    finally:
        loop.close()


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = scope["path"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def _refuse_at_once(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/now``: its head sent now (the scope's SEND_NOW), then its body; anything else as :func:`_answer`."""
    if scope["type"] != "http" or scope["path"] != "/now":
        await _answer(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 503, "headers": [(b"content-length", b"4")]})
    scope[SEND_NOW]()
    await send({"type": "http.response.body", "body": b"/now"})


def _served(paths: tuple[str, ...], app: Any) -> tuple[bytes, list[bytes]]:
    """The answers uvicorn with fnserve's protocol gives ``app`` for POSTs to ``paths`` on one connection, and the
    writes they went out in."""
    writes: list[bytes] = []

    class Counting:  # the socket's transport, counting its writes
        def __init__(self, transport: asyncio.Transport) -> None:
            self.transport = transport

        def write(self, data: Any) -> None:
            writes.append(bytes(data))
            self.transport.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.transport, name)

    class Counted(HttpProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(Counting(transport))  # type: ignore[arg-type]

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # connections wait in its backlog until the server takes them
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, http=Counted, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]})
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            answers = b""
            for path in paths:  # keep-alive: the requests on one connection
                client.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi".encode())
                while not answers.endswith(path.encode()):
                    answers += client.recv(65536)
        return answers, writes
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()


def test_uvicorn_with_it_sends_each_response_in_one_write() -> None:
    answers, writes = _served(("/one", "/two", "/three"), _answer)
    assert answers.count(b"HTTP/1.1 200 OK") == 3
    assert len(writes) == 3, writes  # uvicorn's own protocol writes each response's head and body apart: 6
    for write, path in zip(writes, (b"/one", b"/two", b"/three"), strict=True):
        assert write.startswith(b"HTTP/1.1 200 OK") and write.endswith(path)


def test_an_app_sends_what_is_held_at_once_through_its_scope() -> None:
    """SEND_NOW sends the head the app wrote, not at the turn's end (then the body goes in a write of its own); the
    next response on the connection is held to the end of its turn again."""
    answers, writes = _served(("/now", "/after"), _refuse_at_once)
    assert answers.count(b"HTTP/1.1 503 Service Unavailable") == 1 and answers.count(b"HTTP/1.1 200 OK") == 1
    assert len(writes) == 3, writes
    assert writes[0].startswith(b"HTTP/1.1 503") and writes[0].endswith(b"\r\n\r\n") and writes[1] == b"/now"
    assert writes[2].startswith(b"HTTP/1.1 200 OK") and writes[2].endswith(b"/after")
