"""``fnserve serve`` throughput beside raw onnxruntime's capacity on the same cores, in the same run.

    make bench        (or: python -m tests.bench.bench_serve; needs wrk, and .bench/minilm from make bench-models)

For each model (digits-accurate; all-MiniLM-L6-v2 int8, 64 tokens, when it has been built):

- raw capacity: ``session.run`` at batch 1 back to back, as one process with every core's
  threads and as one single-threaded process per core, for ``RAW_SECONDS``; the better of
  the two is the floor any server of batch-1 requests is measured against. Raw batch-16
  throughput (rows/s) is shown too: what batching could reach at best.
- ``fnserve serve`` under wrk, 16 connections, batch-1 JSON requests: the default layout
  (chosen at start), 0 workers (inference
  in the server process), two such server processes, 1 and 2 inference workers; adaptive
  batching off and on (``max_batch_time_ms = 2``, ``max_batch_size = 16``). Each run
  follows a discarded warm-up.

Figures are ratios to the raw capacity; p99/p50 shows how even the latencies are. wrk
itself runs on the same cores (a few percent of one at these rates).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.bench.floor import parallel_rate
from fnserve.core.host import available_cpus
from tests.bench._wrk import running, wrk
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO

LOAD_SECONDS = int(os.environ.get("BENCH_LOAD_SECONDS", "6"))
RAW_SECONDS = float(os.environ.get("BENCH_RAW_SECONDS", "4"))
MINILM_DIR = REPO / ".bench" / "minilm"
CONFIGS = [  # fnserve serve options
    [],  # the default: the layout fnserve chooses at start
    ["--workers", "0"],
    ["--processes", "2", "--workers", "0"],
    ["--workers", "1"],
    ["--workers", "2"],
]


@dataclass(frozen=True)
class Model:
    name: str
    path: Path
    feed: dict[str, np.ndarray[Any, Any]]  # one request (batch 1)
    batched: dict[str, np.ndarray[Any, Any]]  # 16 rows, for raw batched throughput

    def body(self) -> str:
        inputs = [
            {"name": k, "shape": list(v.shape), "datatype": "FP32" if v.dtype == np.float32 else "INT64"}
            | {"data": v.ravel().tolist()}
            for k, v in self.feed.items()
        ]
        return json.dumps({"inputs": inputs})


def models() -> list[Model]:
    digits = np.load(DEMO_HOLDOUT)["input"]
    found = [
        Model(
            "digits-accurate",
            DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx",
            {"input": digits[:1]},
            {"input": digits[:16]},
        )
    ]
    minilm = MINILM_DIR / "minilm-int8.onnx"
    if minilm.exists():
        sentences = np.load(MINILM_DIR / "sentences.npz")
        one = {k: sentences[k][:1] for k in ("input_ids", "attention_mask")}
        sixteen = {k: sentences[k][:16] for k in ("input_ids", "attention_mask")}
        found.append(Model("minilm-int8", minilm, one, sixteen))
    else:
        print(f"(MiniLM skipped: {minilm} is missing; `make bench-models` builds it)")
    return found


# -- raw onnxruntime --------------------------------------------------------------------------


def raw_rate(model: Model, processes: int, threads: int, feed: dict[str, Any]) -> float:
    """Runs per second of ``processes`` processes of ``threads`` threads each, running back to back."""
    return parallel_rate(model.path, feed, processes, RAW_SECONDS, threads)


# -- fnserve serve ----------------------------------------------------------------------------


def manifest(directory: Path, model: Model, batching: bool) -> Path:
    lines = [
        "[[models]]",
        f'name = "{model.name}"',
        f'path = "{model.path}"',
        f'sha256 = "{hashlib.sha256(model.path.read_bytes()).hexdigest()}"',
    ]
    if batching:
        lines += ["max_batch_time_ms = 2", "max_batch_size = 16"]
    path = directory / f"{model.name}-{'batched' if batching else 'plain'}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    if shutil.which("wrk") is None:
        print("bench_serve skipped: wrk is not installed (make bench installs it with apt-get)")
        return
    cpus = available_cpus()
    tmp = Path(tempfile.mkdtemp(prefix="fnserve-bench-serve-"))
    port = 18091
    for model in models():
        single = raw_rate(model, 1, cpus, model.feed)
        per_core = raw_rate(model, cpus, 1, model.feed)
        capacity = max(single, per_core)
        batched = 16 * max(raw_rate(model, 1, cpus, model.batched), raw_rate(model, cpus, 1, model.batched))
        print(f"\nfnserve serve, {model.name}, batch-1 JSON requests, wrk -c16, {LOAD_SECONDS}s runs, {cpus} CPUs")
        print(f"    raw ORT capacity, batch 1: 1 process x {cpus} threads {single:8.0f}/s; ", end="")
        print(f"{cpus} processes x 1 thread {per_core:8.0f}/s  -> floor {capacity:.0f}/s")
        print(f"    raw ORT, batch 16: {batched:8.0f} rows/s ({batched / capacity:.2f}x the batch-1 capacity)")
        for batching in (False, True):
            path = manifest(tmp, model, batching)
            for options in CONFIGS:
                cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(path), "--port", str(port), *options]
                with running(cmd, port, model=model.name, body=model.body()):
                    wrk(port, [model.body()], model.name, seconds=2)  # warm-up, discarded
                    rps, p50, p99 = wrk(port, [model.body()], model.name, seconds=LOAD_SECONDS)
                label = f"{' '.join(options) or '(default layout)'}, batching {'on ' if batching else 'off'}"
                print(
                    f"    {label:<42}{rps:8.0f} req/s  {rps / capacity:5.2f}x raw   "
                    f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  p99/p50 {p99 / p50:4.1f}"
                )
                port += 1  # a fresh port each time: no TIME_WAIT surprises


if __name__ == "__main__":
    main()
