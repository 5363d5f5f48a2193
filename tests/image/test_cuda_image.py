"""The CUDA variant of the server image, built on the same Debian base: its build is tested everywhere, its GPU
only where there is one (``make test-gpu`` runs the GPU suite). Without a GPU it still starts, and serves the
demo models on the CPU providers that their manifest names."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.images import ping, serving
from tests.image.buildah import Built, started
from tests.servers import wait_for

CHECK = """
import importlib.metadata as metadata, importlib.util, json, onnxruntime as ort
ort.preload_dlls()  # what fnserve does before a CUDA session: pip's CUDA and cuDNN libraries, mapped in
maps = open("/proc/self/maps").read()
names = {d.metadata["Name"].lower() for d in metadata.distributions()}
print(json.dumps({
    "providers": ort.get_available_providers(),
    "onnxruntime": "onnxruntime" in names,
    "onnxruntime_gpu": metadata.version("onnxruntime-gpu"),
    "cudart": "libcudart.so" in maps,
    "cudnn": "libcudnn" in maps,
    "nvml": importlib.util.find_spec("pynvml") is not None,
}))
"""


def test_the_cuda_variant_has_onnxruntime_gpu_and_pips_cuda_alone(cuda_image: Built, tmp_path: Path) -> None:
    env = dict(entry.split("=", 1) for entry in cuda_image.config["Env"])
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"  # asks the container toolkit for libcuda
    with started(cuda_image.name, ["python", "-c", CHECK], tmp_path / "check.log") as running:
        assert running.process.wait(120) == 0, running.output()
    found = json.loads(running.output().strip().splitlines()[-1])
    assert "CUDAExecutionProvider" in found["providers"], found
    assert not found["onnxruntime"], "onnxruntime and onnxruntime-gpu are one package: never both"
    assert found["cudart"] and found["cudnn"], found
    assert found["nvml"], "the GPU gauges (nv_gpu_*) read NVML through nvidia-ml-py"


def test_the_cuda_variant_starts_without_a_gpu(cuda_image: Built, tmp_path: Path) -> None:
    with serving(cuda_image, tmp_path / "serve.log") as (running, url, _):
        wait_for(lambda: ping(running, url) == 200, 180, "the CUDA image's server to answer /ping with 200")
