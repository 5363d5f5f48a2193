"""Closed-loop HTTP load: ``wrk`` when it is installed, else a plain-asyncio generator of fnserve's own.

Both keep ``connections`` keep-alive connections busy for ``seconds``, each sending its next
request as soon as the previous answer arrives, cycling over the request bodies given (so a
result cache is not all that is measured). Both report the same :class:`Load`: answers per
second, latency percentiles, errors (connection errors and non-2xx answers).

The built-in generator reads each answer by its Content-Length, no HTTP library in between,
and can also collect each answer's ``Server-Timing`` stages and ``device``. Its own ceiling
(what it reaches against a server that answers at once) is :func:`ceiling`, which ``fnserve bench`` prints
beside its figures: it must stay far above what the server under test answers.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
_TIMING = re.compile(rb"(?i)\r\nserver-timing: *([^\r]*)")
_ENTRY = re.compile(rb'([\w-]+)(?:;dur=([\d.]+))?(?:;desc="([^"]*)")?')


@dataclass
class Load:
    """What one closed-loop run measured. Latencies in milliseconds."""

    connections: int
    seconds: float
    requests: int
    rate: float  # answers per second, errors included
    p50: float
    p90: float
    p99: float
    errors: int = 0  # connection errors and non-2xx answers
    generator: str = "built-in"
    stages: dict[str, float] = field(default_factory=dict)  # mean Server-Timing milliseconds per stage
    devices: Counter[str] = field(default_factory=Counter)  # Server-Timing device of each answer


def request_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """One HTTP/1.1 POST, as sent on the wire."""
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {"Content-Type": "application/json"}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


# -- the built-in generator --------------------------------------------------------------------------


@dataclass
class _Tally:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    stage_sums: dict[str, float] = field(default_factory=dict)
    timed: int = 0
    devices: Counter[str] = field(default_factory=Counter)


def _read_timings(head: bytes, tally: _Tally) -> None:
    found = _TIMING.search(head)
    if found is None:
        return
    tally.timed += 1
    for name, duration, desc in _ENTRY.findall(found.group(1)):
        if name == b"device" and desc:
            tally.devices[desc.decode()] += 1
        elif duration:
            stage = name.decode()
            tally.stage_sums[stage] = tally.stage_sums.get(stage, 0.0) + float(duration)


async def _connection(
    host: str, port: int, requests: Sequence[bytes], first: int, until: float, timings: bool, tally: _Tally
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    n = first
    try:
        while (now := time.perf_counter()) < until:
            writer.write(requests[n % len(requests)])
            n += 1
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                found = _LENGTH.search(head)
                await reader.readexactly(int(found.group(1)) if found else 0)
            except (asyncio.IncompleteReadError, ConnectionError):
                tally.errors += 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            tally.latencies.append(time.perf_counter() - now)
            if head[9:10] != b"2":
                tally.errors += 1
            if timings:
                _read_timings(head, tally)
    finally:
        writer.close()


def _process(
    host: str,
    port: int,
    requests: Sequence[bytes],
    connections: int,
    offset: int,
    seconds: float,
    timings: bool,
    start: Any,
    queue: Any,
) -> None:
    tally = _Tally()

    async def main() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(
            *(_connection(host, port, requests, offset + i, until, timings, tally) for i in range(connections))
        )

    start.wait()
    began = time.perf_counter()
    asyncio.run(main())
    queue.put((tally, time.perf_counter() - began))


def run(
    host: str,
    port: int,
    requests: bytes | Sequence[bytes],
    *,
    connections: int,
    seconds: float,
    processes: int = 1,
    timings: bool = False,
) -> Load:
    """Closed-loop load of ``requests`` (whole HTTP requests, see :func:`request_bytes`) over ``connections``
    connections in ``processes`` generator processes; ``timings``: collect the Server-Timing stages too."""
    requests = [requests] if isinstance(requests, bytes) else list(requests)
    context = multiprocessing.get_context("spawn")
    start, queue = context.Event(), context.Queue()
    shares = [connections // processes + (i < connections % processes) for i in range(processes)]
    offsets = [sum(shares[:i]) for i in range(len(shares))]
    workers = [
        context.Process(target=_process, args=(host, port, requests, n, at, seconds, timings, start, queue))
        for n, at in zip(shares, offsets, strict=True)
        if n
    ]
    for worker in workers:
        worker.start()
    start.set()
    results: list[tuple[_Tally, float]] = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
    total = _Tally()
    for tally, _ in results:
        total.latencies += tally.latencies
        total.errors += tally.errors
        for stage, ms in tally.stage_sums.items():
            total.stage_sums[stage] = total.stage_sums.get(stage, 0.0) + ms
        total.timed += tally.timed
        total.devices.update(tally.devices)
    elapsed = max(took for _, took in results)
    stages = {name: value / total.timed for name, value in total.stage_sums.items()} if total.timed else {}
    return _load(connections, elapsed, sorted(total.latencies), total.errors, stages, total.devices)


def _load(
    connections: int,
    elapsed: float,
    latencies: list[float],
    errors: int,
    stages: dict[str, float],
    devices: Counter[str],
) -> Load:
    if not latencies:
        nan = float("nan")
        return Load(connections, elapsed, 0, 0.0, nan, nan, nan, errors, stages=stages, devices=devices)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))] * 1e3

    rate = len(latencies) / elapsed
    return Load(
        connections, elapsed, len(latencies), rate, pct(0.5), pct(0.9), pct(0.99), errors, "built-in", stages, devices
    )


def instant_server() -> int:
    """A loopback HTTP server that answers every request at once, in a daemon thread; its port."""
    import socket
    import threading

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                found = _LENGTH.search(head)
                await reader.readexactly(int(found.group(1)) if found else 0)
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)  # connections wait in the backlog until the server's loop accepts them

    def server() -> None:
        async def main() -> None:
            srv = await asyncio.start_server(serve, sock=sock)
            await srv.serve_forever()

        asyncio.run(main())

    threading.Thread(target=server, daemon=True).start()
    return int(sock.getsockname()[1])


def ceiling(*, wrk: bool = False, seconds: float = 2.0, connections: int = 16) -> float:
    """Requests per second a generator (the built-in one, or wrk) reaches against :func:`instant_server`:
    its own limit, which the figures it measures must stay well under. The instant server shares the
    CPUs, so this is a lower bound."""
    port = instant_server()
    if wrk:
        return run_wrk(f"http://127.0.0.1:{port}/", [b"{}"], connections=connections, seconds=seconds).rate
    request = request_bytes("127.0.0.1", port, "/", b"{}")
    return run("127.0.0.1", port, request, connections=connections, seconds=seconds).rate


# -- wrk ---------------------------------------------------------------------------------------------

_WRK_DONE = re.compile(r"^fnserve-wrk (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$", re.MULTILINE)


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk_script(bodies: Sequence[bytes], content_type: str = "application/json") -> str:
    """A wrk Lua script that POSTs ``bodies`` in turn (text bodies: V2 JSON) and prints what :func:`run_wrk`
    reads: requests, microseconds, connection errors, non-2xx answers, p50, p90, p99 (µs)."""
    literals = []
    for body in bodies:
        text = body.decode()
        level = 0
        while f"]{'=' * level}]" in text:
            level += 1
        literals.append(f"[{'=' * level}[{text}]{'=' * level}]")
    return (
        f"local bodies = {{{', '.join(literals)}}}\n"
        "local i = 0\n"
        'wrk.method = "POST"\n'
        f'wrk.headers["Content-Type"] = "{content_type}"\n'
        "request = function()\n"
        "  i = i % #bodies + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[i])\n"
        "end\n"
        "done = function(summary, latency, requests)\n"
        "  local e = summary.errors\n"
        '  io.write(string.format("fnserve-wrk %d %d %d %d %d %d %d\\n", summary.requests, summary.duration,\n'
        "    e.connect + e.read + e.write + e.timeout, e.status,\n"
        "    latency:percentile(50), latency:percentile(90), latency:percentile(99)))\n"
        "end\n"
    )


def run_wrk(url: str, bodies: Sequence[bytes], *, connections: int, seconds: float, threads: int = 1) -> Load:
    """Closed-loop load of POSTs of ``bodies`` to ``url`` by wrk."""
    with tempfile.TemporaryDirectory(prefix="fnserve-wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(wrk_script(bodies))
        command = ["wrk", f"-t{max(1, min(threads, connections))}", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
        command += ["--timeout", "30s", "-s", str(script), url]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    found = _WRK_DONE.search(out)
    if found is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    requests, micros, failed, non2xx, p50, p90, p99 = (int(g) for g in found.groups())
    elapsed = micros / 1e6
    return Load(
        connections, elapsed, requests, requests / elapsed, p50 / 1e3, p90 / 1e3, p99 / 1e3, failed + non2xx, "wrk"
    )


if __name__ == "__main__":
    print(f"built-in load generator ceiling, 1 process, 16 connections: {ceiling():.0f} requests/s")
