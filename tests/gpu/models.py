"""The GPU suite's inputs and one-model manifests cut from the export's (shared by tests/gpu and bench_gpu)."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

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
