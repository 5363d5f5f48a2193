"""A server under wrk as the HTTP benchmark loads it: its process started and asked until it answers, then wrk at 16
connections against one model, any failed request failing the run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from fnserve.bench.load import run_wrk
from fnserve.bench.sweep import process_tree
from tests.bench._digits import BODY, MODEL

LOAD_SECONDS = int(os.environ.get("BENCH_LOAD_SECONDS", "8"))


@contextlib.contextmanager
def running(
    cmd: list[str], port: int, env: dict[str, str] | None = None, model: str = MODEL, body: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, once it answers an inference request (a 2xx one)."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, **quiet)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd} exited with {proc.returncode}")
            try:
                url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
                answer = httpx.post(url, content=body or BODY, timeout=30)
                if answer.status_code != 503:  # 503: listening while its models load
                    answer.raise_for_status()
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd} did not answer")
            time.sleep(0.1)
        yield proc
    finally:
        tree = process_tree(proc.pid) if proc.poll() is None else []
        proc.terminate()
        proc.wait(timeout=30)
        # Its children (front processes, workers) too: one still exiting takes CPU from what is measured next.
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in tree[1:]) and time.monotonic() < deadline:
            time.sleep(0.05)


def wrk(
    port: int, bodies: Sequence[str], model: str = MODEL, seconds: int = LOAD_SECONDS
) -> tuple[float, float, float]:
    """Requests/s, p50 and p99 (ms) of wrk at 16 connections POSTing ``bodies`` in turn; any failed request (a
    connection error, a non-2xx answer) fails the run."""
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    result = run_wrk(url, [b.encode() for b in bodies], connections=16, seconds=seconds)
    if result.errors:
        raise RuntimeError(f"{result.errors} of {result.requests} requests to {url} failed")
    return result.rate, result.p50, result.p99
