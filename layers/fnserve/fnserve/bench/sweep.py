"""The sweep: real ``fnserve serve`` processes on loopback, one per configuration, each loaded at rising
concurrency until it saturates.

The search follows the procedure the serving guidance gives, in stages, each starting from the best
configuration so far (so a sweep costs minutes, not the product of every option):

1. **layout**: inference in one front process, then one worker process (the one-process maxima); then
   one front process or one worker per CPU (the N-process maxima). More processes than CPUs only pays
   when they wait on I/O or a GPU, so the sweep stops at the CPU count.
2. **threads and pinning**: for a one-process layout, fewer intra-op threads than CPUs; then each
   inference process pinned to its own CPUs (``--cpu-affinity``).
3. **batching**: adaptive batching within a latency budget (``max_batch_time_ms``, ``max_batch_size``),
   including the manifest's own setting if it has one.

Each configuration's server gets a manifest of the benchmarked target alone, without its result cache
(the figures are of computing answers), and without adaptive batching unless the configuration sets it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fnserve.bench import load as loadgen
from fnserve.bench import perf_analyzer
from fnserve.bench.requests import Request
from fnserve.core.errors import ConfigError

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GAIN = 1.05  # a concurrency level must beat the best so far by this much, or the server is saturated
MIN_LEVELS = 3
BATCHING = ((1.0, 8), (2.0, 16), (5.0, 32))  # (max_batch_time_ms, max_batch_size) tried in stage 3
_BATCH_KEYS = (
    "max_batch_time_ms",
    "length_buckets",
    "batch_buckets",
    "pad_inputs",
    "max_batch_tokens",
    "max_batch_attention",
)


@dataclass(frozen=True)
class Config:
    """One way to run the server: front processes, inference workers in each, intra-op threads per
    inference process (None: fnserve's default, the CPUs shared out), pinning, and adaptive batching."""

    processes: int = 1
    workers: int = 0
    threads: int | None = None
    pin: bool = False
    batch_time_ms: float | None = None
    batch_size: int | None = None
    manifest_batching: bool = False  # the manifest's own adaptive batching, as written

    @property
    def inference_processes(self) -> int:
        return self.processes * max(1, self.workers)

    def label(self) -> str:
        parts = [f"{self.processes} proc", f"{self.workers} wkr"]
        if self.threads is not None:
            parts.append(f"{self.threads} thr")
        if self.pin:
            parts.append("pinned")
        if self.manifest_batching:
            parts.append("manifest batching")
        elif self.batch_time_ms is not None:
            parts.append(f"batch {self.batch_size}/{self.batch_time_ms:g}ms")
        return " ".join(parts)

    def serve_args(self) -> list[str]:
        args = ["--processes", str(self.processes), "--workers", str(self.workers)]
        return args + (["--cpu-affinity"] if self.pin else [])

    def env(self) -> dict[str, str]:
        return {"FNSERVE_INTRA_OP_THREADS": str(self.threads)} if self.threads is not None else {}

    def snippet(self, manifest: Path, target: str, model: str) -> str:
        """The configuration, ready to paste: the command line, the same as environment variables, and the
        manifest lines for the model when it batches."""
        env = {"FNSERVE_MANIFEST": str(manifest), "FNSERVE_SERVER_PROCESSES": str(self.processes)}
        env |= {"FNSERVE_PARALLEL_WORKERS": str(self.workers)} | self.env()
        env |= {"FNSERVE_CPU_AFFINITY": "true"} if self.pin else {}
        threads = "".join(f"{k}={v} " for k, v in self.env().items())
        lines = [
            f"{threads}fnserve serve -m {manifest} {' '.join(self.serve_args())}",
            "# or, as environment variables (a container's):",
            " ".join(f"{k}={v}" for k, v in env.items()) + " fnserve serve",
        ]
        if self.manifest_batching:
            lines.append(f"# {model!r} keeps the manifest's own adaptive batching")
        elif self.batch_time_ms is not None:
            lines += [
                f"# in the manifest, [[models]] name = {model!r}:",
                f"max_batch_time_ms = {self.batch_time_ms:g}",
                f"max_batch_size = {self.batch_size}",
            ]
        else:
            lines.append(f"# in the manifest, [[models]] name = {model!r}: no max_batch_time_ms (batching off)")
        return "\n".join(lines)


@dataclass(frozen=True)
class Point:
    """One concurrency level of one configuration."""

    concurrency: int
    rate: float
    p50: float
    p90: float
    p99: float
    errors: int
    cpu_ms: float  # server CPU time (every process) per answer
    generator: str
    stages: dict[str, float] = field(default_factory=dict)


@dataclass
class Result:
    config: Config
    stage: str
    points: list[Point] = field(default_factory=list)
    error: str | None = None

    def best(self, p99_ms: float | None = None) -> Point | None:
        """The most answers per second without errors, and within ``p99_ms`` when given."""
        fits = [p for p in self.points if not p.errors and (p99_ms is None or p.p99 <= p99_ms)]
        return max(fits, key=lambda p: p.rate) if fits else None

    def to_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "label": self.config.label(), "stage": self.stage} | {
            "points": [asdict(p) for p in self.points],
            "error": self.error,
        }


# -- one server ----------------------------------------------------------------------------------------


def variant_manifest(manifest: Path, target: str, config: Config, directory: Path) -> Path:
    """A manifest of ``target`` alone (a model's versions, or a pipeline and its model), without result
    caching, batching as ``config`` says; JSON, its paths resolved against the original's directory."""
    try:
        data = tomllib.loads(manifest.read_text()) if manifest.suffix != ".json" else json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"manifest {manifest} cannot be read: {exc}") from None
    pipelines = [p for p in data.get("pipelines", []) if p.get("name") == target]
    model = pipelines[0]["model"] if pipelines else target
    models = [dict(m) for m in data.get("models", []) if m.get("name") == model]
    for entry in (*models, *pipelines):
        entry.pop("cache_ttl_seconds", None)
    for entry in models:
        if config.batch_time_ms is not None:  # the manifest's padding (length and batch buckets) is kept
            entry["max_batch_time_ms"] = config.batch_time_ms
            entry["max_batch_size"] = min(config.batch_size or 1, int(entry.get("max_batch_size", 1024)))
            buckets = [b for b in entry.pop("batch_buckets", []) if b <= entry["max_batch_size"]]
            if buckets:
                entry["batch_buckets"] = buckets
        elif not config.manifest_batching:  # batching off, and what only applies with it
            for key in _BATCH_KEYS:
                entry.pop(key, None)
    home = manifest.resolve().parent
    base = Path(data.get("base_dir", home))
    base = base if base.is_absolute() else (home / base).resolve()
    variant = {"models": models, "pipelines": pipelines, "base_dir": str(base)}
    path = directory / "manifest.json"
    path.write_text(json.dumps(variant))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running ``fnserve serve`` of one configuration."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the server's processes: it, and everything it started."""
        return sum(_cpu(pid) for pid in process_tree(self.process.pid))


@contextlib.contextmanager
def serving(
    manifest: Path, target: str, config: Config, first: Request, *, directory: Path, timeout: float = 180.0
) -> Iterator[Server]:
    """``fnserve serve`` of ``config`` on a free loopback port, once it has answered ``first``; stopped after."""
    work = Path(tempfile.mkdtemp(prefix="config-", dir=directory))
    path = variant_manifest(manifest, target, config, work)
    port = free_port()
    command = [sys.executable, "-m", "fnserve", "serve", "-m", str(path), "--port", str(port), *config.serve_args()]
    env = {**os.environ, **config.env(), "FNSERVE_ACCESS_LOG": "false"}
    log = work / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(process, port, log)
    try:
        _wait_answering(server, target, first, timeout)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def _wait_answering(server: Server, target: str, first: Request, timeout: float) -> None:
    import httpx

    url = f"http://127.0.0.1:{server.port}/v2/models/{target}/infer"
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise ConfigError(f"the server exited with {server.process.returncode}:\n{server.tail()}")
        try:
            answer = httpx.post(url, content=first.body, headers=first.headers, timeout=60)
        except httpx.TransportError:
            answer = None
        if answer is None or answer.status_code == 503:  # not listening yet, or listening while its models load
            if time.monotonic() > deadline:
                raise ConfigError(f"the server did not answer in {timeout:.0f} s:\n{server.tail()}") from None
            time.sleep(0.05)
            continue
        if answer.status_code >= 300:
            raise ConfigError(f"the server answered the first request with {answer.status_code}: {answer.text}")
        return


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


# -- load --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadOptions:
    seconds: float = 2.0
    max_concurrency: int = 64
    generator: str = "auto"  # auto (perf_analyzer, else wrk, when installed), perf_analyzer, wrk, built-in
    timings: bool = False  # collect Server-Timing stages (built-in generator only)

    def perf_analyzer(self) -> bool:
        auto = self.generator == "auto" and not self.timings and perf_analyzer.have()
        return self.generator == "perf_analyzer" or auto

    def wrk(self) -> bool:
        auto = self.generator == "auto" and not self.timings and not self.perf_analyzer() and loadgen.have_wrk()
        return self.generator == "wrk" or auto


def measure_point(
    server: Server, target: str, requests: Sequence[Request], concurrency: int, options: LoadOptions
) -> Point:
    """One closed-loop run at ``concurrency``, with the server's CPU time per answer."""
    path = f"/v2/models/{target}/infer"
    before = server.cpu_seconds()
    if options.perf_analyzer():
        found = perf_analyzer.run(server.port, target, requests, concurrency=concurrency, seconds=options.seconds)
    elif options.wrk() and all(r.headers.get("Content-Type") == "application/json" for r in requests):
        threads = max(1, min(concurrency, (os.cpu_count() or 2) // 2))
        found = loadgen.run_wrk(
            f"http://127.0.0.1:{server.port}{path}",
            [r.body for r in requests],
            connections=concurrency,
            seconds=options.seconds,
            threads=threads,
        )
    else:
        wire = [loadgen.request_bytes("127.0.0.1", server.port, path, r.body, r.headers) for r in requests]
        found = loadgen.run(
            "127.0.0.1", server.port, wire, connections=concurrency, seconds=options.seconds, timings=options.timings
        )
    cpu_ms = (server.cpu_seconds() - before) * 1e3 / max(1, found.requests)
    return Point(
        concurrency, found.rate, found.p50, found.p90, found.p99, found.errors, cpu_ms, found.generator, found.stages
    )


def saturate(
    server: Server,
    target: str,
    requests: Sequence[Request],
    options: LoadOptions,
    progress: Callable[[str], None] | None = None,
) -> list[Point]:
    """Concurrency 1, 2, 4, ... until throughput stops rising by ``GAIN`` (after ``MIN_LEVELS`` levels), an
    error is answered, or ``max_concurrency`` is reached."""
    loadgen_warm = replace(options, seconds=min(1.0, options.seconds))
    measure_point(server, target, requests, 2, loadgen_warm)  # warm-up, discarded
    points: list[Point] = []
    best = 0.0
    for level in (c for c in LEVELS if c <= options.max_concurrency):
        if progress is not None:
            progress(f"concurrency {level}")
        point = measure_point(server, target, requests, level, options)
        points.append(point)
        if point.errors:
            break
        if len(points) >= MIN_LEVELS and point.rate < best * GAIN:
            break
        best = max(best, point.rate)
    return points


# -- the staged search --------------------------------------------------------------------------------


def layouts(cpus: int) -> list[Config]:
    """Stage 1: the one-process maxima (in-process, one worker), then the N-process ones."""
    found = [Config(processes=1, workers=0), Config(processes=1, workers=1)]
    if cpus > 1:
        found += [Config(processes=cpus, workers=0), Config(processes=1, workers=cpus)]
    return found


def tunings(best: Config, cpus: int) -> list[Config]:
    """Stage 2: fewer intra-op threads for a one-process layout (powers of two below the CPUs)."""
    found = []
    if best.inference_processes == 1:
        threads = 1
        while threads < cpus:
            found.append(replace(best, threads=threads))
            threads *= 2
    return found


def pinning(best: Config, cpus: int) -> list[Config]:
    """Stage 2, then: the best so far pinned, where there is more than one share of the CPUs to pin to."""
    return [replace(best, pin=True)] if best.inference_processes > 1 or (best.threads or cpus) < cpus else []


def batchings(best: Config, max_batch_size: int, manifest_batches: bool) -> list[Config]:
    """Stage 3: adaptive batching on the best configuration: the manifest's own, then ``BATCHING``."""
    found = [replace(best, manifest_batching=True)] if manifest_batches else []
    for ms, size in BATCHING:
        if size <= max_batch_size:
            found.append(replace(best, batch_time_ms=ms, batch_size=size))
    return found


def best_config(results: Sequence[Result], p99_ms: float | None) -> Result | None:
    scored = [(r, r.best(p99_ms)) for r in results]
    ranked = [(r, p) for r, p in scored if p is not None]
    return max(ranked, key=lambda rp: rp[1].rate)[0] if ranked else None
