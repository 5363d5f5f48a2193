"""The manifest's provider tables made into ONNX Runtime's options, and TensorRT's pip libraries loaded.

These run on any machine: what ONNX Runtime is handed is checked here, and what it does with it on a
GPU is checked by tests/gpu.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest
from msgspec import ValidationError

from fnserve.core.errors import ModelLoadError
from fnserve.core.models.manifest.providers import Provider
from fnserve.core.models.providers import TENSORRT_LIBRARIES, ort_provider


def provider(table: dict[str, Any]) -> Provider:
    return msgspec.convert(table, Provider)


def translated(table: dict[str, Any], where: str = "m") -> tuple[str, dict[str, Any]]:
    chosen = ort_provider(provider(table), where)
    assert isinstance(chosen, tuple), chosen  # a table's provider comes with its options
    return chosen


def test_cuda_options_are_onnxruntimes() -> None:
    table = {"name": "CUDAExecutionProvider", "device_id": 1, "memory_limit_mb": 512, "copy_streams": False}
    name, options = translated(table)
    assert name == "CUDAExecutionProvider"
    assert options == {
        "device_id": 1,
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "do_copy_in_default_stream": True,
        "arena_extend_strategy": "kSameAsRequested",
        "gpu_mem_limit": 512 * 2**20,
    }


def test_tensorrt_options_are_onnxruntimes_and_the_cache_folder_is_made(tmp_path: Path) -> None:
    cache = tmp_path / "engines" / "minilm"
    table = {
        "name": "TensorrtExecutionProvider",
        "fp16": True,
        "cache_dir": str(cache),
        "max_workspace_mb": 2048,
        "min_shapes": {"input_ids": [1, 16], "attention_mask": [1, 16]},
        "opt_shapes": {"input_ids": [16, 64], "attention_mask": [16, 64]},
        "max_shapes": {"input_ids": [64, 128], "attention_mask": [64, 128]},
    }
    name, options = translated(table)
    assert name == "TensorrtExecutionProvider"
    assert options == {
        "device_id": 0,
        "trt_fp16_enable": True,
        "trt_int8_enable": False,
        "trt_max_workspace_size": 2048 * 2**20,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache),
        "trt_profile_min_shapes": "input_ids:1x16,attention_mask:1x16",
        "trt_profile_opt_shapes": "input_ids:16x64,attention_mask:16x64",
        "trt_profile_max_shapes": "input_ids:64x128,attention_mask:64x128",
    }
    assert cache.is_dir()


def test_a_tensorrt_cache_folder_that_cannot_be_made_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    table = {"name": "TensorrtExecutionProvider", "cache_dir": str(tmp_path / "a-file" / "engines")}
    with pytest.raises(ModelLoadError, match="model m: TensorRT's cache_dir .*a-file/engines' cannot be made"):
        translated(table, "model m")


@pytest.mark.parametrize(
    ("profile", "error"),
    [
        ({"min_shapes": {"x": [1, 8]}, "opt_shapes": {"x": [4, 8]}, "max_shapes": {"y": [8, 8]}}, "same inputs"),
        ({"min_shapes": {"x": [4, 8]}, "opt_shapes": {"x": [2, 8]}, "max_shapes": {"x": [8, 8]}}, "min <= opt <= max"),
        ({"min_shapes": {"x": [1]}, "opt_shapes": {"x": [2, 8]}, "max_shapes": {"x": [8, 8]}}, "min <= opt <= max"),
        ({"min_shapes": {"x": [0, 8]}, "opt_shapes": {"x": [2, 8]}, "max_shapes": {"x": [8, 8]}}, "all positive"),
    ],
)
def test_tensorrt_shape_profiles_are_checked(profile: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        provider({"name": "TensorrtExecutionProvider", **profile})


def test_tensorrt_libraries_installed_by_pip_are_loaded_before_a_session_needs_them(tmp_path: Path) -> None:
    # A stand-in for tensorrt-cu13-libs' tensorrt_libs package: real shared objects under TensorRT's names.
    origin = importlib.util.find_spec("_ctypes").origin  # type: ignore[union-attr]
    if origin is None or not Path(origin).is_file():
        pytest.skip("this Python has no _ctypes shared object to stand in for TensorRT's libraries")
    package = tmp_path / "site" / "tensorrt_libs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("IMPORTED = True\n")
    names = [f"{stem}.10" for stem in TENSORRT_LIBRARIES]
    for name in names:
        shutil.copy(origin, package / name)
    (package / "libnvinfer_builder_resource.so.10.16.1").write_text("not loaded: libnvinfer opens it itself")
    script = textwrap.dedent(
        """
        import sys
        from fnserve.core.models.providers import preload_tensorrt
        preload_tensorrt()
        print(sys.modules["tensorrt_libs"].IMPORTED)
        print(open("/proc/self/maps").read())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": f"{package.parent}:{':'.join(sys.path)}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("True\n")
    assert all(str(package / name) in out for name in names), out
    assert "builder_resource" not in out


def test_without_tensorrt_libs_nothing_is_loaded_and_nothing_fails() -> None:
    script = (
        "import sys; from fnserve.core.models.providers import preload_tensorrt; preload_tensorrt(); "
        "print('tensorrt_libs' in sys.modules, 'libnvinfer' in open('/proc/self/maps').read())"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False False" and not done.stderr
