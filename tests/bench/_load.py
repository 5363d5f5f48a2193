"""A closed-loop HTTP load generator in plain asyncio: for machines without wrk (the GPU machine).

``connections`` keep-alive connections, spread over ``processes`` processes (one event loop
each), each sending the same request again as soon as its answer arrives, for ``seconds``.
Each answer is read by its Content-Length, no HTTP library in between; its status and the
Server-Timing ``device`` are counted. Its own ceiling (about 15-20k requests/s a process on
loopback with a tiny answer) is printed by ``python -m tests.bench._load --ceiling``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_DEVICE = re.compile(rb'device;desc="([^"]*)"')


@dataclass
class Load:
    """What a run measured: answers per second, latency percentiles (ms), statuses and devices seen."""

    rate: float
    p50: float
    p99: float
    statuses: Counter[int] = field(default_factory=Counter)
    devices: Counter[str] = field(default_factory=Counter)


def request_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {"Content-Type": "application/json"}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _connection(host: str, port: int, request: bytes, until: float, out: list[Any]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    latencies, statuses, devices = out
    try:
        while (now := time.perf_counter()) < until:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - now)
            statuses[int(head[9:12])] += 1
            found = _DEVICE.search(head)
            if found:
                devices[found.group(1).decode()] += 1
    finally:
        writer.close()


def _process(host: str, port: int, request: bytes, connections: int, seconds: float, start: Any, queue: Any) -> None:
    out: list[Any] = [[], Counter(), Counter()]

    async def main() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_connection(host, port, request, until, out) for _ in range(connections)))

    start.wait()
    began = time.perf_counter()
    asyncio.run(main())
    queue.put((out, time.perf_counter() - began))


def run(host: str, port: int, request: bytes, *, connections: int, seconds: float, processes: int = 1) -> Load:
    """Closed-loop load of ``request`` over ``connections`` connections in ``processes`` processes."""
    context = multiprocessing.get_context("spawn")
    start, queue = context.Event(), context.Queue()
    shares = [connections // processes + (i < connections % processes) for i in range(processes)]
    workers = [
        context.Process(target=_process, args=(host, port, request, n, seconds, start, queue)) for n in shares if n
    ]
    for worker in workers:
        worker.start()
    start.set()
    results = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
    latencies = sorted(x for ((out, _),) in zip(results) for x in out[0])
    elapsed = max(took for _, took in results)
    statuses: Counter[int] = Counter()
    devices: Counter[str] = Counter()
    for ((out, _),) in zip(results):
        statuses.update(out[1])
        devices.update(out[2])
    if not latencies:
        return Load(0.0, float("nan"), float("nan"), statuses, devices)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Load(len(latencies) / elapsed, statistics.median(latencies) * 1e3, p99 * 1e3, statuses, devices)


def ceiling(processes: int = 1, seconds: float = 3.0) -> float:
    """Requests per second this generator reaches against a server that answers at once (its own limit)."""
    import socket
    import threading

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections wait in the backlog until the server's loop accepts them
    port = sock.getsockname()[1]

    def server() -> None:
        async def main() -> None:
            srv = await asyncio.start_server(serve, sock=sock)
            await srv.serve_forever()

        asyncio.run(main())

    threading.Thread(target=server, daemon=True).start()
    load = run(
        "127.0.0.1",
        port,
        request_bytes("127.0.0.1", port, "/", b"{}"),
        connections=16,
        seconds=seconds,
        processes=processes,
    )
    return load.rate


if __name__ == "__main__":
    print(f"load generator ceiling, 1 process, 16 connections: {ceiling():.0f} requests/s")
