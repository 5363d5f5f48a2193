"""``fnserve serve`` on a GPU beside raw onnxruntime CUDA capacity on the same GPU, in the same run.

    FNSERVE_GPU_MODELS=DIR python -m tests.bench.bench_gpu   (DIR from infra/models/export_gpu_models.py)

Skipped where onnxruntime has no CUDA provider or no GPU answers. For MiniLM fp32 and fp16
(64 tokens) and ResNet-50 fp16:

- raw capacity: ``session.run`` on the CUDA provider back to back, at batch 1 and at the
  largest batch bucket (rows/s), and the same with IO binding (outputs left on the GPU and
  copied once), to show whether binding saves anything here;
- ``fnserve serve`` (in-process session, ``--workers 0``) under closed-loop load of batch-1
  requests (the binary tensor extension) from :mod:`fnserve.bench.load`: adaptive batching off
  and on, at concurrency 1 and 64. Targets: batching on reaches >= 0.8x the raw batch-1
  capacity, and >= 3x the unbatched throughput at concurrency 64. The batched queue is sized to
  the 64 clients (``max_queue_size = 64``): this measures throughput, and the default queue of
  one batch refuses some of 64 clients whenever the running batch is short of ResNet-50's 32
  rows (0.6% to 4.4% of the answers in one H100 run), as it is meant to under overload;
- MiniLM fp32 on TensorRT with fp16 layers, where TensorRT's libraries are installed: raw capacity
  and ``fnserve serve`` with adaptive batching, beside the CUDA provider's figures;
- the mixed-device pool (MiniLM fp32, batching off): one GPU worker alone against the same
  worker with CPU workers to overflow to, at concurrency 64, with the share each device ran.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from fnserve.bench import load as _load
from fnserve.core.models.manifest import load_manifest
from fnserve.core.models.providers import TENSORRT, ort_provider
from tests.gpu.models import (
    BATCHING_KEYS,
    CUDA_GRAPHS,
    one_model_manifest,
    pixels,
    tensorrt_missing,
    tensorrt_providers,
    tokens,
)

SECONDS = float(os.environ.get("BENCH_LOAD_SECONDS", "8"))
ONLY = os.environ.get("BENCH_GPU_ONLY", "")  # a model's name: its rows alone (no TensorRT, no mixed pool)
RAW_SECONDS = float(os.environ.get("BENCH_RAW_SECONDS", "3"))
CLIENT_PROCESSES = int(os.environ.get("BENCH_CLIENT_PROCESSES", "4"))
CUDA = "CUDAExecutionProvider"
GRAPHS = {"execution_providers": CUDA_GRAPHS, "session_per_shape": "false"}
QUEUE = {"max_queue_size": "64"}  # the closed loop's 64 clients all wait their turn: no refusal in a throughput run


def gpu_models() -> Path | None:
    """The exported models' folder, where a GPU and onnxruntime's CUDA provider are both here."""
    folder = os.environ.get("FNSERVE_GPU_MODELS")
    if not folder or CUDA not in ort.get_available_providers() or shutil.which("nvidia-smi") is None:
        return None
    return Path(folder)


def feed_of(name: str, rows: int) -> dict[str, np.ndarray[Any, Any]]:
    return tokens(rows, 64) if name.startswith("minilm") else pixels(rows)


def cuda_session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=[CUDA, "CPUExecutionProvider"])


def raw(session: ort.InferenceSession, feed: dict[str, np.ndarray[Any, Any]], binding: bool = False) -> float:
    """Calls per second of ``session``, back to back for RAW_SECONDS."""
    outputs = [o.name for o in session.get_outputs()]
    if binding:
        bound = session.io_binding()

        def call() -> None:
            for name, array in feed.items():
                bound.bind_cpu_input(name, array)
            for name in outputs:
                bound.bind_output(name, "cuda")
            session.run_with_iobinding(bound)
            bound.copy_outputs_to_cpu()

    else:

        def call() -> None:
            session.run(outputs, feed)

    for _ in range(20):
        call()
    calls, began = 0, time.perf_counter()
    while time.perf_counter() - began < RAW_SECONDS:
        call()
        calls += 1
    return calls / (time.perf_counter() - began)


def request(name: str, feed: dict[str, np.ndarray[Any, Any]], port: int) -> bytes:
    """A batch-1 V2 request with its tensors in the binary tensor extension."""
    inputs, blobs = [], []
    for tensor, array in feed.items():
        datatype = "INT64" if array.dtype == np.int64 else "FP32"
        raw_bytes = np.ascontiguousarray(array).tobytes()
        inputs.append(
            {
                "name": tensor,
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(raw_bytes)},
            }
        )
        blobs.append(raw_bytes)
    head = json.dumps(
        {
            "inputs": inputs,
            "outputs": [{"name": "embedding" if "minilm" in name else "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    return _load.request_bytes("127.0.0.1", port, f"/v2/models/{name}/infer", head + b"".join(blobs), headers)


@contextmanager
def serving(path: Path, *options: str) -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(path), "--port", str(port), *options]
    log = open(path.with_suffix(f".{port}.log"), "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # warm-up builds every shape: cuDNN's search takes a while
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fnserve serve exited: {path.with_suffix(f'.{port}.log').read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
                    if conn.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("fnserve serve did not become ready")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def load(port: int, body: bytes, connections: int) -> _load.Load:
    _load.run("127.0.0.1", port, body, connections=connections, seconds=1.5, processes=CLIENT_PROCESSES)  # warm-up
    return _load.run(
        "127.0.0.1", port, body, connections=connections, seconds=SECONDS, processes=CLIENT_PROCESSES, timings=True
    )


def served(manifest: Path, name: str, one: float, label: str) -> dict[int, _load.Load]:
    """``fnserve serve`` (in-process session) on ``manifest`` under batch-1 load at concurrency 1 and 64, each
    printed beside ``one``, the raw batch-1 rate."""
    results = {}
    with serving(manifest, "--workers", "0") as port:
        body = request(name, feed_of(name, 1), port)
        for connections in (1, 64):
            result = results[connections] = load(port, body, connections)
            print(
                f"    serve, {label}, concurrency {connections:>2}: {result.rate:8.0f} req/s  "
                f"{result.rate / one:5.2f}x raw batch 1   p50 {result.p50:7.2f} ms  p99 {result.p99:7.2f} ms  "
                f"errors {result.errors}"
            )
    return results


def tensorrt(models: Path, tmp: Path, on_cuda: dict[str, Any]) -> dict[str, Any]:
    """MiniLM fp32 on TensorRT with fp16 layers, its engines built once into one cache: raw capacity at batch 1 and
    64, and served with the export's adaptive batching, beside the same model on the CUDA provider."""
    name, largest = "minilm-fp32", 64
    providers = tensorrt_providers(tmp / "trt-engines", max_rows=largest, max_length=128)
    manifest = one_model_manifest(models, tmp, name, execution_providers=providers)
    table = load_manifest(manifest).models[0].execution_providers[0]
    session = ort.InferenceSession(
        str(models / name / "1" / "model.onnx"), providers=[ort_provider(table, name), "CPUExecutionProvider"]
    )
    assert session.get_providers()[0] == TENSORRT, session.get_providers()
    one = raw(session, feed_of(name, 1))
    many = raw(session, feed_of(name, largest)) * largest
    print(
        f"\n{name} on TensorRT, fp16: raw batch 1 {one:8.0f}/s ({one / on_cuda['raw_batch1']:.2f}x CUDA fp32); "
        f"batch {largest} {many:8.0f} rows/s ({many / on_cuda[f'raw_batch{largest}_rows']:.2f}x CUDA fp32)"
    )
    row: dict[str, Any] = {"raw_batch1": one, f"raw_batch{largest}_rows": many}
    for connections, result in served(manifest, name, one, "batching on").items():
        row[f"serve_batched_c{connections}"] = result.rate
        print(f"      (CUDA fp32 at concurrency {connections}: {on_cuda[f'serve_batched_c{connections}']:.0f} req/s)")
    return row


def main() -> None:
    models = gpu_models()
    if models is None:
        print("bench_gpu skipped: no GPU, no CUDA provider in onnxruntime, or FNSERVE_GPU_MODELS unset")
        return
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    print(f"\nGPU: {gpu.stdout.strip()}; onnxruntime {ort.__version__}; load generator: {CLIENT_PROCESSES} processes")
    tmp = Path(tempfile.mkdtemp(prefix="fnserve-bench-gpu-"))
    figures: dict[str, Any] = {}
    for name, largest in (("minilm-fp32", 64), ("minilm-fp16", 64), ("resnet50-fp16", 32)):
        if ONLY and name != ONLY:
            continue
        path = models / name / "1" / "model.onnx"
        one = raw(cuda_session(path), feed_of(name, 1))
        many = raw(cuda_session(path), feed_of(name, largest)) * largest
        bound = raw(cuda_session(path), feed_of(name, largest), binding=True) * largest
        print(
            f"\n{name}: raw ORT CUDA, batch 1 {one:8.0f}/s ({1e3 / one:.3f} ms); batch {largest} {many:8.0f} rows/s "
            f"({many / one:.1f}x); with IO binding {bound:8.0f} rows/s ({bound / many:.2f}x run())"
        )
        row: dict[str, Any] = {"raw_batch1": one, f"raw_batch{largest}_rows": many, "raw_iobinding_rows": bound}
        for batching in (False, True):
            if batching:
                manifest = one_model_manifest(models, tmp, name, **QUEUE)
            else:
                manifest = one_model_manifest(models, tmp, name, BATCHING_KEYS)
            for connections, result in served(manifest, name, one, f"batching {'on ' if batching else 'off'}").items():
                row[f"serve_{'batched' if batching else 'plain'}_c{connections}"] = result.rate
        if name.startswith("resnet"):
            # A CNN on CUDA rebuilds its cuDNN plans at every change of batch shape: the export's manifest keeps
            # one session per shape; against it, one session for all shapes, and one CUDA graph per shape.
            for label, change in (("one session", {"session_per_shape": "false"}), ("CUDA graphs", GRAPHS)):
                manifest = one_model_manifest(models, tmp, name, **change, **QUEUE)
                for connections, result in served(manifest, name, one, f"batching on, {label}").items():
                    row[f"serve_batched_{label.replace(' ', '_')}_c{connections}"] = result.rate
        ratio = row["serve_batched_c64"] / row["serve_plain_c64"]
        print(
            f"    adaptive batching at concurrency 64: {ratio:.2f}x unbatched (target >= 3); "
            f"{row['serve_batched_c64'] / one:.2f}x raw batch-1 capacity (target >= 0.8)"
        )
        figures[name] = row
    out = Path(os.environ.get("BENCH_GPU_JSON", tmp / "bench_gpu.json"))
    if ONLY:
        out.write_text(json.dumps(figures, indent=2))
        print(f"\nfigures: {out}")
        return
    missing = tensorrt_missing()
    if missing is None:
        figures["minilm-fp32 on TensorRT, fp16"] = tensorrt(models, tmp, figures["minilm-fp32"])
    else:
        print(f"\nTensorRT rows skipped: {missing}")
    # The mixed pool: the GPU filled to its capacity, the rest to CPU workers.
    path = one_model_manifest(models, tmp, "minilm-fp32", BATCHING_KEYS)
    for options in (["--gpu-workers", "1"], ["--gpu-workers", "1", "--gpu-capacity", "2", "--workers", "8"]):
        with serving(path, *options) as port:
            result = load(port, request("minilm-fp32", feed_of("minilm-fp32", 1), port), 64)
        print(
            f"\nmixed pool, minilm-fp32 unbatched, concurrency 64, {' '.join(options)}: {result.rate:8.0f} req/s  "
            f"p50 {result.p50:7.2f} ms  p99 {result.p99:7.2f} ms  devices {dict(result.devices)}"
        )
        figures[" ".join(options)] = {
            "rate": result.rate,
            "p50": result.p50,
            "p99": result.p99,
            "devices": dict(result.devices),
        }
    out.write_text(json.dumps(figures, indent=2))
    print(f"\nfigures: {out}")


if __name__ == "__main__":
    main()
