"""Heavy models on the TensorRT provider: outputs against the CPU's, engines built at start and reused, serving.

Skipped, with the reason, where TensorRT's libraries are not installed (``pip install
'fnserve[tensorrt]'``, or a TensorRT image); on a GPU without them tests/gpu/test_gpu.py checks
that a TensorRT provider asked for stops the start instead.

Tolerances, TensorRT against the fp32 model on the CPU, on the same inputs: MiniLM embeddings'
cosine similarity >= 0.999 and ResNet-50 logits' relative L2 error <= 2e-2 with ``fp16 = true``;
with fp32 layers (which TensorRT runs as TF32 where it may) cosine >= 0.999 and relative error
<= 5e-3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import onnxruntime as ort
import pytest

from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.manifest.providers import Provider
from fnserve.core.models.providers import TENSORRT, ort_provider
from fnserve.core.models.registry import ModelRegistry
from tests.gpu.models import (
    cosine,
    first_runs_like_later_ones,
    model,
    one_model_manifest,
    pixels,
    relative,
    tensorrt_missing,
    tensorrt_providers,
    tokens,
)
from tests.servers import start_server

MISSING = tensorrt_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
CPU = ["CPUExecutionProvider"]


def trt_session(path: Path, cache: Path, **options: Any) -> ort.InferenceSession:
    """A session on TensorRT with fnserve's translation of the manifest table ``options``, CUDA and CPU behind."""
    table = msgspec.convert({"name": TENSORRT, "cache_dir": str(cache), **options}, Provider)
    session = ort.InferenceSession(str(path), providers=[ort_provider(table, str(path)), CPU[0]])
    assert session.get_providers()[0] == TENSORRT  # no silent fall back inside the test either
    return session


@pytest.mark.parametrize(("fp16", "floor"), [(True, 0.999), (False, 0.999)])
def test_minilm_on_tensorrt_matches_the_cpu(gpu_models: Path, tmp_path: Path, fp16: bool, floor: float) -> None:
    shapes = {"input_ids": [1, 16], "attention_mask": [1, 16]}
    session = trt_session(
        model(gpu_models, "minilm-fp32"),
        tmp_path / "trt",
        fp16=fp16,
        min_shapes=shapes,
        opt_shapes={k: [4, 64] for k in shapes},
        max_shapes={k: [4, 256] for k in shapes},
    )
    cpu = ort.InferenceSession(str(model(gpu_models, "minilm-fp32")), providers=CPU)
    for length in (16, 64, 256):  # one engine, its profile covering all three
        feed = tokens(4, length, seed=length)
        (got,) = session.run(["embedding"], feed)
        (expected,) = cpu.run(["embedding"], feed)
        assert np.isfinite(got).all() and got.shape == (4, 384)
        assert cosine(got, expected) >= floor, length


@pytest.mark.parametrize(("fp16", "limit"), [(True, 2e-2), (False, 5e-3)])
def test_resnet_on_tensorrt_matches_the_cpu(gpu_models: Path, tmp_path: Path, fp16: bool, limit: float) -> None:
    session = trt_session(
        model(gpu_models, "resnet50-fp32"),
        tmp_path / "trt",
        fp16=fp16,
        min_shapes={"pixels": [1, 3, 224, 224]},
        opt_shapes={"pixels": [2, 3, 224, 224]},
        max_shapes={"pixels": [4, 3, 224, 224]},
    )
    cpu = ort.InferenceSession(str(model(gpu_models, "resnet50-fp32")), providers=CPU)
    for rows in (1, 2, 4):
        feed = pixels(rows)
        (got,) = session.run(["logits"], feed)
        (expected,) = cpu.run(["logits"], feed)
        assert np.isfinite(got).all() and got.shape == (rows, 1000)
        assert relative(got, expected) <= limit, rows


def test_engines_are_built_at_start_and_loaded_from_the_cache_at_the_next(gpu_models: Path, tmp_path: Path) -> None:
    cache = tmp_path / "trt"
    manifest = one_model_manifest(
        gpu_models,
        tmp_path,
        "minilm-fp32",
        execution_providers=tensorrt_providers(cache, max_rows=16, max_length=64),
        batch_buckets="[1, 4, 16]",
        length_buckets="[16, 64]",
    )
    loaded = ModelRegistry(load_manifest(manifest)).get("minilm-fp32")
    assert loaded.placement.providers[0] == TENSORRT and loaded.placement.device == "cuda:0"
    assert loaded.placement.fallback is None
    built = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert any(name.endswith(".engine") for name in built), built
    assert any(name.endswith(".timing") for name in built), built
    first_runs_like_later_ones(loaded.session, "embedding", [(r, n) for r in (1, 4, 16) for n in (16, 64)])
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == built  # nothing rebuilt by requests
    again = ModelRegistry(load_manifest(manifest)).get("minilm-fp32")  # a later start: the cache's engines
    assert again.placement.providers[0] == TENSORRT
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == built


def test_serve_answers_from_tensorrt(gpu_models: Path, tmp_path: Path) -> None:
    manifest = one_model_manifest(
        gpu_models,
        tmp_path,
        "minilm-fp32",
        execution_providers=tensorrt_providers(tmp_path / "trt", max_rows=8, max_length=32),
        batch_buckets="[1, 2, 4, 8]",
        length_buckets="[16, 32]",
    )
    proc, url = start_server(["-m", str(manifest), "--workers", "0"], tmp_path / "serve.log")
    try:
        ready = httpx.get(f"{url}/v2/models/minilm-fp32/ready").json()
        assert ready["providers"][0] == TENSORRT and ready["device"] == "cuda:0"
        feed = tokens(1, 20)
        body = {
            "inputs": [
                {"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.ravel().tolist()}
                for k, v in feed.items()
            ]
        }
        response = httpx.post(f"{url}/v2/models/minilm-fp32/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert 'device;desc="cuda:0"' in response.headers["server-timing"]
        got = np.array(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(1, 384)
        expected = ort.InferenceSession(str(model(gpu_models, "minilm-fp32")), providers=CPU).run(None, feed)[0]
        assert cosine(got, expected) >= 0.999
    finally:
        proc.terminate()
        proc.wait(30)
