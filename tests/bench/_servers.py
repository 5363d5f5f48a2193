"""The servers the batching benchmark weighs, started on a port and loaded by wrk at a set concurrency, each run's
CPU per request the CPU time of the server's processes over the requests answered."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from fnserve.bench.load import run_wrk
from fnserve.bench.sweep import process_tree
from tests.bench._minilm import MODEL, TOKENIZER, length_buckets
from tests.bench._timing import cpu_seconds
from tests.helpers import DEMO_MANIFEST

SECONDS = float(os.environ.get("BENCH_BATCHING_SECONDS", "10"))
LEAN = "lean batching server"  # the floor end to end (tests/bench/lean_batch_server.py)
LEAN_TEXT = "lean batching text server"


@dataclass(frozen=True)
class Server:
    label: str
    command: list[str]
    env: dict[str, str]
    model: str  # the name requests go to
    text: bool


@dataclass(frozen=True)
class Run:
    rate: float
    cpu_ms: float  # server CPU per request
    p50: float
    p99: float


def servers(cpus: int) -> list[Server]:
    """What is served (the port comes last, from :func:`serving`)."""
    fnserve = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST)]
    uvicorn = [sys.executable, "-m", "uvicorn", "--workers", str(cpus), "--loop", "uvloop"]
    uvicorn += ["--http", "httptools", "--no-access-log", "--log-level", "warning"]
    naive = {"PLAIN_MODEL_PATH": str(MODEL), "PLAIN_THREADS": "1", "PLAIN_TOKENIZER": str(TOKENIZER)}
    lean = [sys.executable, "-m", "tests.bench.lean_batch_server"]
    text = ["--tokenizer", str(TOKENIZER), "--buckets", ",".join(map(str, length_buckets()))]
    return [
        Server("fnserve, default layout", fnserve, {}, "minilm-l6", False),
        Server("fnserve, access log off", fnserve, {"FNSERVE_ACCESS_LOG": "false"}, "minilm-l6", False),
        Server(f"fnserve, 1 process x {cpus} threads", [*fnserve, "--processes", "1"], {}, "minilm-l6", False),
        Server("naive FastAPI + ORT", [*uvicorn, "tests.bench.plain_server:app"], naive, "minilm-l6", False),
        Server(LEAN, lean, naive, "minilm-l6", False),
        Server("fnserve minilm-embed, default", fnserve, {}, "minilm-embed", True),
        Server("naive text server", [*uvicorn, "tests.bench.plain_embed_server:app"], naive, "minilm-embed", True),
        Server(LEAN_TEXT, [*lean, *text], naive, "minilm-embed", True),
    ]


@contextlib.contextmanager
def serving(
    server: Server, port: int, body: bytes, command: list[str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``server`` started on ``port`` (``command`` instead of its own with ``--port``), once it answers ``body``."""
    command = command or [*server.command, "--port", str(port)]
    env = {**os.environ, **server.env}
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}/v2/models/{server.model}/infer"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{server.label} exited with {proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                answer = httpx.post(url, content=body, timeout=30)
                if answer.status_code != 503:  # 503: listening while its models load
                    answer.raise_for_status()
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.label} did not answer")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def load(proc: subprocess.Popen[bytes], url: str, bodies: Sequence[bytes], connections: int) -> Run:
    run_wrk(url, bodies, connections=connections, seconds=2)  # warm-up, discarded
    pids = process_tree(proc.pid)
    before = sum(cpu_seconds(pid) for pid in pids)
    found = run_wrk(url, bodies, connections=connections, seconds=SECONDS)
    used = sum(cpu_seconds(pid) for pid in pids) - before
    if found.errors:
        raise RuntimeError(f"{found.errors} of {found.requests} requests to {url} failed")
    return Run(found.rate, used / found.requests * 1e3, found.p50, found.p99)
