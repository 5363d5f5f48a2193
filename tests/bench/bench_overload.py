"""A server driven at about 3x its capacity: the admitted keep their latency, the excess is told at once.

    make bench        (or: python -m tests.bench.bench_overload; BENCH_OVERLOAD_SECONDS, default 30)

Three ``fnserve serve`` (one front process running the models, pinned to the first CPU when there are two or more;
one loaded at a time), with adaptive batching on MiniLM (int8, 16 tokens a request, batches of 8 rows) and
digits-accurate (256 rows a request, so that a Python load generator on the other CPU can offer three times what it
serves; batches of 1,024 rows): one with a queue of one batch (``max_queue_size``), one with fnserve's default bound
(the wait, ``max_queue_delay_ms``: closed loops of any size are answered, and under overload the answered requests
wait up to it), one with a queue that never fills. For each model: its capacity (closed loop, 16 connections), its
latency unloaded (open loop at half the capacity), then an open loop at three times the capacity on each server.
Arrivals are scheduled at fixed intervals and each latency is counted from its scheduled time (no coordinated
omission: a request the generator could not send on time waits in the count). Printed side by side: answered p50/p99
against the unloaded p99 (and how much of it was the server's queue and model, from Server-Timing), refusals (503)
and how fast they came beside their floor (the same arrivals on a bare app that refuses every request at once, on
the same CPU, beside the model computing the share of the time it did in fnserve's run:
``tests/bench/refuse_server.py``), and the server's RSS over the run. Beside them, the floor end to end: the lean
batching server (``tests/bench/lean_batch_server.py``: it parses, batches, runs, encodes and refuses at a queue of
one batch, and does nothing more) on the same CPU, its own unloaded p99 at the same rate, then the same arrivals:
what any server that batches and sheds at those bounds pays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from fnserve.core.host import available_cpus
from tests.bench._timing import percentile
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.moto import free_port

SECONDS = float(os.environ.get("BENCH_OVERLOAD_SECONDS", "30"))
CONNECTIONS = 512  # enough that arrivals at 3x never wait for a free connection
# A batch's rows: under overload every batch is full, and a request waits for the one running, then runs in its
# own; at 8 MiniLM rows (about 13 ms) and 1,024 digits rows (4 requests) that stays near the unloaded latency.
BATCH_ROWS = {"minilm-l6": 8, "digits-accurate": 1024}
UNLOADED_SECONDS = 10.0  # the latency at half the capacity: about 1% of its requests make its p99
BASELINE_SECONDS = 10.0  # the same overload on the server without admission bounds
NEIGHBOUR_SECONDS = 10.0  # one model flooded beside another


@dataclass
class Run:
    offered: float  # requests per second scheduled
    seconds: float
    latencies: dict[int, list[float]] = field(default_factory=dict)  # status -> seconds from the scheduled time
    late: int = 0  # sent later than scheduled by more than 10 ms (the generator's own limit)
    server: list[float] = field(default_factory=list)  # an answered request's seconds in the server's queue and model

    def of(self, status: int) -> list[float]:
        return self.latencies.get(status, [])


def demo_models() -> dict[str, dict[str, Any]]:
    """The demo manifest's models, by name."""
    import tomllib

    return {m["name"]: m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"]}


def manifest(directory: Path, kind: str) -> Path:
    """The two models with adaptive batching: ``unbounded``, a queue that never fills (what a server without
    admission control does); ``bounded``, a queue of one batch (``max_queue_size``); ``defaults``, fnserve's own
    bound (the wait); ``priority``, the bounded ones and digits-accurate a priority above MiniLM's."""
    demo = demo_models()
    minilm, digits = demo["minilm-l6"], demo["digits-accurate"]
    if kind == "unbounded":  # nor a bound on the wait
        bounds = {name: "max_queue_size = 1000000\nmax_queue_delay_ms = 1e9\n" for name in BATCH_ROWS}
    elif kind == "defaults":
        bounds = dict.fromkeys(BATCH_ROWS, "")
    else:
        bounds = {name: f"max_queue_size = {rows}\n" for name, rows in BATCH_ROWS.items()}
    if kind == "priority":
        bounds["digits-accurate"] += "priority = 1\n"
    text = f'''[[models]]
name = "minilm-l6"
path = "{DEMO_MANIFEST.parent / minilm["path"]}"
sha256 = "{minilm["sha256"]}"
max_batch_size = {BATCH_ROWS["minilm-l6"]}
max_batch_time_ms = 2
length_buckets = [16]
pad_inputs = ["input_ids", "attention_mask", "token_type_ids"]
{bounds["minilm-l6"]}
[[models]]
name = "digits-accurate"
path = "{DEMO_MANIFEST.parent / digits["path"]}"
sha256 = "{digits["sha256"]}"
max_batch_size = {BATCH_ROWS["digits-accurate"]}
max_batch_time_ms = 2
{bounds["digits-accurate"]}'''
    path = directory / f"manifest-{kind}.toml"
    path.write_text(text)
    return path


def request_bytes(port: int, model: str) -> bytes:
    if model == "minilm-l6":
        ids = np.full((1, 16), 1000, np.int64)
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        inputs = [{"name": n, "shape": [1, 16], "datatype": "INT64", "data": a.ravel()} for n, a in arrays.items()]
    else:
        x = np.tile(np.load(DEMO_HOLDOUT)["input"][:64], (4, 1))
        inputs = [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel()}]
    body = orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY)
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, float]:
    """An answer's status, and the server's own time for it in its queue and model (ms, from Server-Timing)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length, server = 0, 0.0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
        elif line[:14].lower() == b"server-timing:":
            stages = dict(part.strip().split(";dur=") for part in line[14:].decode().split(",") if ";dur=" in part)
            server = float(stages.get("queue", 0)) + float(stages.get("infer", 0))
    await reader.readexactly(length)
    return status, server


async def closed_loop(port: int, wire: bytes, connections: int, seconds: float) -> float:
    """Answers (200s: a refusal is no capacity) per second, ``connections`` callers back to back."""
    stop = time.perf_counter() + seconds
    done = 0

    async def caller() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(wire)
            served = (await _answer(reader))[0] == 200
            done += served  # after the await: `done += await ...` would read done before it, and lose counts
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(connections)))
    return done / (time.perf_counter() - started)


async def open_loop(port: int, wire: bytes, rate: float, seconds: float, connections: int = CONNECTIONS) -> Run:
    """Requests scheduled every 1/rate s for ``seconds``, each on an idle connection of the pool (``connections``:
    few enough, at a low rate, that each is used again within the server's 5 s keep-alive)."""
    run = Run(rate, seconds)
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))

    async def one(scheduled: float) -> None:
        reader, writer = await idle.get()
        if time.perf_counter() - scheduled > 0.01:
            run.late += 1
        writer.write(wire)
        status, server = await _answer(reader)
        run.latencies.setdefault(status, []).append(time.perf_counter() - scheduled)
        if status == 200:
            run.server.append(server / 1e3)
        idle.put_nowait((reader, writer))

    tasks = []
    start = time.perf_counter() + 0.05
    for k in range(int(rate * seconds)):
        scheduled = start + k / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    while not idle.empty():
        idle.get_nowait()[1].close()
    return run


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass(frozen=True)
class Server:
    proc: subprocess.Popen[bytes]
    port: int


async def overload(server: Server, wire: bytes, rate: float, seconds: float) -> tuple[Run, list[float], float]:
    """An open loop at ``rate``: the run, the server's RSS each second, and the share of its core the generator used."""
    rss: list[float] = []
    sampling = True

    async def sample() -> None:
        while sampling:
            rss.append(rss_mb(server.proc.pid))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = await open_loop(server.port, wire, rate, seconds)
    generator = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    sampling = False
    await sampler
    return run, rss, generator


def report(name: str, run: Run, rss: list[float], generator: float, base_p99: float) -> None:
    admitted, refused = run.of(200), run.of(503)
    others = {s: len(v) for s, v in run.latencies.items() if s not in (200, 503)}
    print(
        f"  {name}: {run.offered:,.0f} req/s offered for {run.seconds:g} s ({run.late} sent >10 ms late; the "
        f"generator used {generator:.0%} of its core)"
    )
    if admitted:
        p99 = percentile(admitted, 99) * 1e3
        print(
            f"    answered {len(admitted):,} ({len(admitted) / run.seconds:,.0f}/s): p50 "
            f"{percentile(admitted, 50) * 1e3:.2f} ms, p99 {p99:.2f} ms = {p99 / base_p99:.2f}x the unloaded p99; "
            f"slowest {max(admitted) * 1e3:.1f} ms"
        )
    if refused:
        print(
            f"    refused {len(refused):,} (503 + Retry-After): p50 {percentile(refused, 50) * 1e3:.2f} ms, "
            f"p99 {percentile(refused, 99) * 1e3:.2f} ms"
        )
    print(f"    other answers: {others or 'none'}")
    if run.late > 0.01 * run.offered * run.seconds:
        print(
            "    over 1% sent late: all 512 connections were waiting for answers (the server answers, refusals "
            "included, slower than requests arrive), or the generator itself fell behind"
        )
    print(f"    server RSS over the run: {min(rss):.0f}-{max(rss):.0f} MB (first {rss[0]:.0f}, last {rss[-1]:.0f})")


@dataclass(frozen=True)
class Computed:
    """A model's batches so far, from Triton's statistics: the full ones (``BATCH_ROWS``) and their nanoseconds, and
    the nanoseconds of every batch."""

    full: int
    full_ns: int
    ns: int


async def computed(server: Server, model: str) -> Computed:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{server.port}/v2/models/{model}/stats")
    full, full_ns, ns = 0, 0, 0
    for stat in response.json()["model_stats"][0]["batch_stats"]:
        ns += stat["compute_infer"]["ns"]
        if stat["batch_size"] == BATCH_ROWS[model]:
            full, full_ns = stat["compute_infer"]["count"], stat["compute_infer"]["ns"]
    return Computed(full, full_ns, ns)


@contextlib.contextmanager
def floor_server(module: str, args: list[str], pinned: bool, env: dict[str, str] | None = None) -> Iterator[int]:
    """A floor's server, ``python -m module *args`` (``{port}`` in them: the free port it is given), on the CPU
    fnserve's server had, once ``GET /`` answers 200: its port."""
    port = free_port()
    cmd = [sys.executable, "-m", module, *(arg.replace("{port}", str(port)) for arg in args)]
    proc = subprocess.Popen(
        ["taskset", "-c", "0", *cmd] if pinned else cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(Server(proc, port), "/")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def refusal_floor(model: str, rate: float, busy: float, pinned: bool) -> Run:
    """The same open loop on a bare app that refuses every request at once, on the CPU fnserve's server had, beside
    the model computing ``busy`` of the time (``tests/bench/refuse_server.py``)."""
    path = DEMO_MANIFEST.parent / demo_models()[model]["path"]
    args = ["{port}", str(path), str(BATCH_ROWS[model]), f"{busy:.4f}"]
    with floor_server("tests.bench.refuse_server", args, pinned) as port:
        return await open_loop(port, request_bytes(port, model), rate, BASELINE_SECONDS)


async def lean_floor(model: str, unloaded_rate: float, rate: float, pinned: bool) -> tuple[Run, Run]:
    """The floor end to end: the lean batching server (``tests/bench/lean_batch_server.py``: parse, batch, run,
    encode, refuse, nothing more) with the bounded server's (batches of ``BATCH_ROWS``, a queue of one batch), one
    process on the CPU fnserve's server had: its unloaded run at fnserve's unloaded rate, then ``rate``."""
    rows = str(BATCH_ROWS[model])
    args = ["--port", "{port}", "--processes", "1", "--max-batch", rows, "--queue", rows]
    env = {**os.environ, "PLAIN_MODEL_PATH": str(DEMO_MANIFEST.parent / demo_models()[model]["path"])}
    with floor_server("tests.bench.lean_batch_server", args, pinned, env) as port:
        wire = request_bytes(port, model)
        await closed_loop(port, wire, 16, 1.0)  # warm-up
        unloaded = await open_loop(port, wire, unloaded_rate, UNLOADED_SECONDS)
        return unloaded, await open_loop(port, wire, rate, BASELINE_SECONDS)


async def measure(
    unbounded: Server, bounded: Server, defaults: Server, model: str, pinned: bool
) -> tuple[float, float]:
    """Capacity and unloaded latency on the unbounded server; 3x the capacity on the bounded one, the refusal floor
    at the same rate, then the server with fnserve's default bound and the unbounded one at that rate."""
    wire = request_bytes(unbounded.port, model)
    for server in (unbounded, bounded, defaults):
        await closed_loop(server.port, wire, 16, 1.0)  # warm-up
    capacity = await closed_loop(unbounded.port, wire, 16, 5.0)
    unloaded = await open_loop(unbounded.port, wire, capacity / 2, UNLOADED_SECONDS)
    base_p99 = percentile(unloaded.of(200), 99) * 1e3
    print(
        f"\n{model}: capacity {capacity:,.0f} req/s (closed loop, 16 connections, batches of {BATCH_ROWS[model]} rows)"
    )
    print(
        f"  unloaded, {unloaded.offered:,.0f} req/s offered: p50 {percentile(unloaded.of(200), 50) * 1e3:.2f} ms, "
        f"p99 {base_p99:.2f} ms"
    )
    before, started = await computed(bounded, model), time.perf_counter()
    run, rss, generator = await overload(bounded, wire, 3 * capacity, SECONDS)
    after, elapsed = await computed(bounded, model), time.perf_counter() - started
    busy = min(1.0, (after.ns - before.ns) / 1e9 / elapsed)
    floor = await refusal_floor(model, run.offered, busy, pinned)
    lean_unloaded, lean = await lean_floor(model, unloaded.offered, run.offered, pinned)
    report("3x capacity, a queue of one batch (max_queue_size)", run, rss, generator, base_p99)
    admitted, refused = run.of(200), run.of(503)
    floor_p99 = percentile(floor.of(503), 99) * 1e3
    print(
        f"    the refusal floor: a bare app refusing every request at once, on the same CPU beside the model busy "
        f"{busy:.0%} of the time (as in this run), the same arrivals for {floor.seconds:g} s: p50 "
        f"{percentile(floor.of(503), 50) * 1e3:.2f} ms, p99 {floor_p99:.2f} ms"
    )
    lean_base = percentile(lean_unloaded.of(200), 99) * 1e3
    lean_ratio = percentile(lean.of(200), 99) * 1e3 / lean_base if lean.of(200) else float("nan")
    lean_refused = percentile(lean.of(503), 99) * 1e3 if lean.of(503) else float("nan")
    print(
        f"    the floor end to end: the lean batching server (parse, batch, run, encode, refuse; fnserve's bounds), on "
        f"the same CPU, {lean.seconds:g} s each: unloaded p99 {lean_base:.2f} ms; the same arrivals: answered "
        f"{len(lean.of(200)) / lean.seconds:,.0f}/s, p99 {lean_ratio:.2f}x its unloaded p99; refused "
        f"{len(lean.of(503)) / lean.seconds:,.0f}/s, p99 {lean_refused:.2f} ms"
    )
    if admitted and refused:
        refused_p99 = percentile(refused, 99) * 1e3
        print(
            f"    targets: answered p99 {percentile(admitted, 99) * 1e3 / base_p99:.2f}x the unloaded p99 (<= 2x; "
            f"the lean floor's {lean_ratio:.2f}x), refusals p99 {refused_p99:.2f} ms (< 5 ms; "
            f"{refused_p99 / floor_p99:.2f}x the bare refusals' {floor_p99:.2f} ms, the lean floor's "
            f"{lean_refused:.2f} ms), served {len(admitted) / run.seconds / capacity:.2f}x the capacity"
        )
    if after.full > before.full:
        batch_ms = (after.full_ns - before.full_ns) / (after.full - before.full) / 1e6
        print(
            f"    floor: a request under sustained overload waits for the full batch running, then runs in its own: "
            f"2 x {batch_ms:.1f} ms (a full batch's run over this load, from the server's statistics) = "
            f"{2 * batch_ms:.1f} ms = {2 * batch_ms / base_p99:.2f}x the unloaded p99"
        )
    if run.server:
        p99 = percentile(run.server, 99) * 1e3
        print(
            f"    the answered requests' own time in the queue and the model (Server-Timing): p50 "
            f"{percentile(run.server, 50) * 1e3:.1f} ms, p99 {p99:.1f} ms = {p99 / base_p99:.2f}x the unloaded p99"
        )
    run, rss, generator = await overload(defaults, wire, 3 * capacity, BASELINE_SECONDS)
    report("3x capacity, fnserve's default bound (the wait, max_queue_delay_ms)", run, rss, generator, base_p99)
    run, rss, generator = await overload(unbounded, wire, 3 * capacity, BASELINE_SECONDS)
    report("3x capacity, a queue that never fills (no admission control)", run, rss, generator, base_p99)
    return capacity, base_p99


async def neighbours(bounded: Server, priority: Server, unloaded: dict[str, tuple[float, float]]) -> None:
    """MiniLM flooded at 3x its capacity while digits-accurate gets a tenth of its own: digits' latency with equal
    priorities, then with digits' above MiniLM's."""
    minilm, digits = unloaded["minilm-l6"], unloaded["digits-accurate"]
    print(
        f"\nneighbours: minilm-l6 at 3x its capacity ({3 * minilm[0]:,.0f} req/s) beside digits-accurate at a tenth "
        f"of its own ({digits[0] / 10:,.0f} req/s; unloaded p99 {digits[1]:.2f} ms), {NEIGHBOUR_SECONDS:g} s"
    )
    for name, server in (("equal priorities", bounded), ("digits-accurate priority 1, minilm-l6 0", priority)):
        flood = asyncio.create_task(
            open_loop(server.port, request_bytes(server.port, "minilm-l6"), 3 * minilm[0], NEIGHBOUR_SECONDS)
        )
        wire = request_bytes(server.port, "digits-accurate")
        probe = await open_loop(server.port, wire, digits[0] / 10, NEIGHBOUR_SECONDS, connections=32)
        flooded = await flood
        answered = probe.of(200)
        others = {status: len(v) for status, v in probe.latencies.items() if status != 200}
        print(
            f"  {name}: digits-accurate answered {len(answered):,} of {sum(map(len, probe.latencies.values())):,} "
            f"(the others: {others or 'none'}), "
            f"p50 {percentile(answered, 50) * 1e3:.2f} ms, p99 {percentile(answered, 99) * 1e3:.2f} ms "
            f"({percentile(answered, 99) * 1e3 / digits[1]:.2f}x its unloaded p99); minilm-l6 answered "
            f"{len(flooded.of(200)) / flooded.seconds:,.0f}/s, refused {len(flooded.of(503)) / flooded.seconds:,.0f}/s"
        )


def start(work: Path, kind: str, pinned: bool) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(manifest(work, kind)), "--port", str(port)]
    cmd += ["--processes", "1", "--workers", "0"]
    if pinned:
        cmd = ["taskset", "-c", "0", *cmd]
    env = {**os.environ, "FNSERVE_ACCESS_LOG": "false", "FNSERVE_LOG_FORMAT": "json"}
    return Server(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)


def wait_ready(server: Server, path: str = "/v2/health/ready") -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{server.port}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.1)


def main() -> None:
    cpus = available_cpus()
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-overload-"))
    pinned = cpus >= 2 and shutil.which("taskset") is not None
    if pinned:
        os.sched_setaffinity(0, set(range(1, cpus)))
    # One loaded at a time: the others idle.
    servers = {kind: start(work, kind, pinned) for kind in ("unbounded", "bounded", "defaults", "priority")}
    print(
        f"overload: fnserve serve, one front process "
        f"({'on CPU 0, the load generator on the rest' if pinned else 'unpinned'}), "
        f"with a queue of one batch, with its default bound and without; 3x capacity for {SECONDS:g} s per model "
        f"({BASELINE_SECONDS:g} s with the others)"
    )
    try:
        for server in servers.values():
            wait_ready(server)
        import uvloop  # the server's loop too: the generator must not be the slower side

        unloaded = {
            model: uvloop.run(measure(servers["unbounded"], servers["bounded"], servers["defaults"], model, pinned))
            for model in ("minilm-l6", "digits-accurate")
        }
        uvloop.run(neighbours(servers["bounded"], servers["priority"], unloaded))
    finally:
        for server in servers.values():
            server.proc.terminate()
            server.proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
