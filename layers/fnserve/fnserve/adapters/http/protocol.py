"""uvicorn's httptools protocol, with a response's writes leaving in one ``send``.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, then its body on ``http.response.body``: two ``send`` calls, two TCP
segments, and on the receiving side two wake-ups, for a response that fits in one; for a small
model that second system call is a large share of a request's CPU. Here every write of one turn of the
event loop is held and sent at its end, together (:class:`Coalescing`); a response's parts are
written in the same turn whenever the app sends them back to back, as the V2 inference route does.
Everything else is uvicorn's own :class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fnserve.adapters.http.wire import SEND_NOW

HELD_BYTES = 64 * 1024  # past this much in one turn, writes go at once (the transport's flow control sees them)


class Coalescing:
    """A transport whose writes in one turn of the event loop go out in one write, at the turn's end."""

    __slots__ = ("_held", "_loop", "_size", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = [data]
            self._size = len(data)
            self._loop.call_soon(self.flush)
        else:
            self._held.append(data)
            self._size += len(data)
        if self._size > HELD_BYTES:
            self.flush()

    def flush(self) -> None:
        """Send what is held now (a no-op when nothing is)."""
        held, self._held = self._held, None
        if held and not self.transport.is_closing():
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def writelines(self, data: Any) -> None:
        for chunk in data:
            self.write(chunk)

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def close(self) -> None:
        self.flush()  # a transport sends what it was given before it closes
        self.transport.close()

    def abort(self) -> None:
        self._held = None
        self.transport.abort()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + (self._size if self._held is not None else 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through :class:`Coalescing`.

    A complete response waits for the end of its turn too (the other requests the turn answers), rather than
    going out at once: the answers of a turn leave together, so the client sends the next requests together and
    the server wakes once for them, not once each (less CPU a request, more requests a second, no worse p99).

    The app may send a response at once, though (a refusal: its client is to try again shortly, and hears at once):
    each request's scope holds the connection's flush under ``SEND_NOW``. Refusals under overload then come sooner,
    and the answered requests are served alike. The figures: docs/design/coalesced-write.md."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Coalescing(transport, self.loop))  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[SEND_NOW] = self.transport.flush  # type: ignore[literal-required,attr-defined]  # a Coalescing
