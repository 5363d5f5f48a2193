"""perf_analyzer, Triton's load generator, driving ``fnserve bench``'s load when it is installed.

It reads the model's metadata and configuration (Triton's model-configuration extension) and
sends what ``--input-data`` gives it, here the bench's own requests, one row of each; it
measures in windows until they agree (``--concurrency-range`` at one level, latency
percentiles in a CSV). How many requests the server answered in that time comes from the
server itself: its statistics (Triton's statistics extension) before and after.

perf_analyzer ships in tritonclient's manylinux wheels up to 2.39 (``pip install
tritonclient==2.39.0``; it needs ``libb64-0d`` and ``libcudart.so.12``, which the
``nvidia-cuda-runtime-cu12`` wheel brings: ``make perf-analyzer`` sets it up in
``.perf-analyzer/`` with a wrapper on the path).
"""

from __future__ import annotations

import base64
import csv
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fnserve.bench.load import Load
from fnserve.bench.requests import Request
from fnserve.core.codec.tensors import binary_tensor
from fnserve.server.fronts import SHARE_SECONDS

COMMAND = "perf_analyzer"
WINDOWS = 3  # perf_analyzer measures at least three windows that agree


def have() -> bool:
    return shutil.which(COMMAND) is not None


def input_data(requests: Sequence[Request]) -> dict[str, Any]:
    """perf_analyzer's ``--input-data``: each request's first row (it adds the batch dimension itself)."""
    steps = []
    for request in requests:
        step = {}
        for name, array in request.inputs.items():
            whole = np.asarray(array)
            row = whole[:1].reshape(whole.shape[1:])  # an array even for one value a row (a text, an image)
            step[name] = {"content": _content(row), "shape": list(row.shape) or [1]}
        steps.append(step)
    return {"data": steps}


def _content(row: np.ndarray[Any, Any]) -> Any:
    if row.dtype != object:
        return row.ravel().tolist()
    values = row.ravel() if row.ndim else np.array([row.item()], dtype=object)
    try:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    except UnicodeDecodeError:  # an image: perf_analyzer sends base64 content as the tensor's wire bytes as they are
        return {"b64": base64.b64encode(binary_tensor(values, "BYTES")).decode()}


def run(
    port: int,
    target: str,
    requests: Sequence[Request],
    *,
    concurrency: int,
    seconds: float,
    grpc_port: int | None = None,
) -> Load:
    """Closed-loop load of ``requests`` at ``concurrency`` by perf_analyzer, over HTTP (or gRPC on ``grpc_port``)."""
    url = f"http://127.0.0.1:{port}"
    window_ms = max(300, round(seconds * 1000 / WINDOWS))
    batch = requests[0].rows
    before = _answered(url, target)
    with tempfile.TemporaryDirectory(prefix="fnserve-perf-analyzer-") as tmp:
        data, out = Path(tmp) / "input.json", Path(tmp) / "out.csv"
        data.write_text(json.dumps(input_data(requests)))
        command = [
            COMMAND,
            "-m",
            target,
            "-u",
            f"127.0.0.1:{grpc_port or port}",
            "-i",
            "grpc" if grpc_port else "http",
            "-b",
            str(batch),
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            "--measurement-interval",
            str(window_ms),
            "--stability-percentage",
            "100",  # every window counts: the bench's own rounds judge stability
            "--input-data",
            str(data),
            "-f",
            str(out),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60 + 20 * seconds, check=False)
        if done.returncode != 0 or not out.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {' / '.join(tail)}")
        row = next(csv.DictReader(out.read_text().splitlines()))
    time.sleep(2 * SHARE_SECONDS)  # the other front processes' last figures reach the statistics
    answered, failed = (after - was for after, was in zip(_answered(url, target), before, strict=True))

    def us(column: str) -> float:  # microseconds in the CSV, milliseconds here
        return float(row[column]) / 1e3

    stages = {
        "queue": us("Server Queue"),
        "compute_input": us("Server Compute Input"),
        "compute_infer": us("Server Compute Infer"),
        "compute_output": us("Server Compute Output"),
    }
    return Load(
        connections=concurrency,
        seconds=seconds,
        requests=answered + failed,
        rate=float(row["Inferences/Second"]) / batch,
        p50=us("p50 latency"),
        p90=us("p90 latency"),
        p99=us("p99 latency"),
        errors=failed,
        generator="perf_analyzer",
        stages=stages,
    )


def _answered(url: str, target: str) -> tuple[int, int]:
    """Requests the server answered for ``target`` so far, and those it refused (its statistics)."""
    stats = httpx.get(f"{url}/v2/models/{target}/stats", timeout=10).raise_for_status().json()["model_stats"]
    inference = [s["inference_stats"] for s in stats]
    return sum(i["success"]["count"] for i in inference), sum(i["fail"]["count"] for i in inference)
