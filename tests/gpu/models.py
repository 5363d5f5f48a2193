"""The GPU suite's inputs, comparisons and one-model manifests cut from the export's (shared by tests/gpu and
bench_gpu)."""

from __future__ import annotations

import ctypes
import re
import statistics
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from fnserve.core.models.providers import TENSORRT, preload_tensorrt

# The CUDA provider capturing one CUDA graph per batch shape (one_model_manifest's execution_providers).
CUDA_GRAPHS = '[{name = "CUDAExecutionProvider", cuda_graph = true}, "CPUExecutionProvider"]'
BATCHING_KEYS = ("max_batch_time_ms", "batch_buckets", "length_buckets", "pad_inputs", "session_per_shape")


def tokens(rows: int, length: int, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    """MiniLM's inputs: random token ids between [CLS] and [SEP], the first row half padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(rows, length), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    mask[0, length // 2 :] = 0  # one row padded: the pooling must ignore it
    return {"input_ids": ids, "attention_mask": mask}


def pixels(rows: int) -> dict[str, np.ndarray[Any, Any]]:
    """ResNet-50's input: random normal pixels, NCHW."""
    return {"pixels": np.random.default_rng(1).standard_normal((rows, 3, 224, 224), dtype=np.float32)}


def model(root: Path, name: str) -> Path:
    """The exported model ``name``'s file under the export folder ``root``."""
    return root / name / "1" / "model.onnx"


def cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """The lowest cosine similarity between the rows of ``a`` and ``b`` (embeddings against embeddings)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def relative(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """The relative L2 error of ``a`` against ``b`` (logits against logits)."""
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def one_model_manifest(models: Path, directory: Path, name: str, drop: Collection[str] = (), **changes: str) -> Path:
    """The export manifest's entry of ``name`` alone, its path absolute, the ``drop`` keys left out and the
    ``changes`` (key = TOML value) set."""
    text = (models / "manifest.toml").read_text()
    entry = next(e for e in text.split("[[models]]")[1:] if f'name = "{name}"' in e)
    entry = entry.replace(f'path = "{name}/', f'path = "{models.resolve()}/{name}/')
    entry = "\n".join(line for line in entry.splitlines() if line.split(" = ")[0] not in drop) + "\n"
    for key, value in changes.items():
        if re.search(rf"(?m)^{key} = ", entry):
            entry = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", entry)
        else:
            entry += f"{key} = {value}\n"
    path = directory / f"{name}.toml"
    path.write_text("[[models]]" + entry)
    return path


def tensorrt_providers(cache: Path, max_rows: int, max_length: int, fp16: bool = True) -> str:
    """one_model_manifest's execution_providers for MiniLM on TensorRT: engines kept in ``cache``, one shape profile
    from 1x16 to ``max_rows`` x ``max_length`` tokens, CUDA and the CPU behind."""
    shapes = {
        kind: f"{{ input_ids = [{rows}, {length}], attention_mask = [{rows}, {length}] }}"
        for kind, rows, length in (
            ("min", 1, 16),
            ("opt", max_rows, min(64, max_length)),
            ("max", max_rows, max_length),
        )
    }
    profile = ", ".join(f"{kind}_shapes = {value}" for kind, value in shapes.items())
    table = f'name = "{TENSORRT}", fp16 = {str(fp16).lower()}, cache_dir = "{cache}", {profile}'
    return f'[{{ {table} }}, "CUDAExecutionProvider", "CPUExecutionProvider"]'


def tensorrt_missing() -> str | None:
    """Why TensorRT cannot run here, or None when it can."""
    if TENSORRT not in ort.get_available_providers():
        return "onnxruntime has no TensorRT provider (install fnserve[tensorrt])"
    preload_tensorrt()
    try:
        ctypes.CDLL("libnvinfer.so.10")  # pip's, loaded just now, or the system's
    except OSError as exc:
        return f"TensorRT's libraries are not installed (pip install 'fnserve[tensorrt]'): {exc}"
    return None


def first_runs_like_later_ones(session: Any, output: str, shapes: Collection[tuple[int, int]]) -> None:
    """Assert that the first MiniLM run at each (rows, tokens) shape costs what later ones do: warm-up ran every
    shape, so no request pays for a cuDNN search or an engine build (each takes far longer than a run)."""
    for rows, length in shapes:
        feed = tokens(rows, length)
        began = time.perf_counter()
        session.run([output], feed)
        first = time.perf_counter() - began
        later = []
        for _ in range(5):
            began = time.perf_counter()
            session.run([output], feed)
            later.append(time.perf_counter() - began)
        assert first <= 3 * statistics.median(later) + 0.002, (rows, length, first, later)
