"""The GPU suite: skipped unless onnxruntime has the CUDA provider, a GPU answers, and the models are built.

FNSERVE_GPU_MODELS=DIR pytest tests/gpu    (DIR from infra/models/export_gpu_models.py, run where torch is)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import onnxruntime as ort
import pytest


def _gpu() -> str | None:
    """Why the GPU suite cannot run here, or None when it can."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CUDA provider (install fnserve[gpu])"
    if shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        return "no NVIDIA GPU answers"
    if not os.environ.get("FNSERVE_GPU_MODELS"):
        return "FNSERVE_GPU_MODELS is unset (build them with infra/models/export_gpu_models.py)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu()
    if reason is None:
        return
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def gpu_models() -> Path:
    return Path(os.environ["FNSERVE_GPU_MODELS"])
