from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import onnxruntime as ort
import pytest

from fnserve.core.errors import ConfigError, ModelLoadError, ModelNotFound
from fnserve.core.manifest import load_manifest
from fnserve.core.registry import ModelRegistry
from tests.helpers import ManifestWriter, model_bytes


def registry(manifest: Path, **kwargs: object) -> ModelRegistry:
    return ModelRegistry(load_manifest(manifest), **kwargs)  # type: ignore[arg-type]


def test_manifest_errors_name_the_file_and_the_field(tmp_path: Path, write_manifest: ManifestWriter) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_manifest(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]\nname=")
    with pytest.raises(ConfigError, match=r"bad.toml cannot be read"):
        load_manifest(bad)
    manifest = write_manifest({"data": model_bytes(), "max_batch_size": 0})
    with pytest.raises(ConfigError, match=r"model 'scale' \(models.0\) max_batch_size: Input should be greater"):
        load_manifest(manifest)
    text = re.sub(r'sha256 = "[0-9a-f]+"', 'sha256 = "abc"', manifest.read_text())
    manifest.write_text(text.replace("max_batch_size = 0", ""))
    with pytest.raises(ConfigError, match=r"model 'scale' \(models.0\) sha256: Value error, sha256 must be 64 hex"):
        load_manifest(manifest)


def test_relative_paths_resolve_against_the_manifest_directory(write_manifest: ManifestWriter) -> None:
    manifest = write_manifest({"data": model_bytes()})
    assert registry(manifest).get("scale").path == manifest.parent / "scale/1/model.onnx"


def test_models_load_lazily_once_and_are_shared(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"data": model_bytes()}))
    assert not reg.is_loaded("scale")
    first = reg.get("scale")
    assert reg.is_loaded("scale")
    assert reg.get("scale") is first
    assert reg.get("scale", "1") is first


def test_checksum_mismatch_is_refused_naming_model_and_path(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"data": model_bytes(), "sha256": "f" * 64}))
    with pytest.raises(
        ModelLoadError,
        match=r"model 'scale' version '1': file .*scale/1/model.onnx has sha256 [0-9a-f]{64}, "
        r"but the manifest says f{64}",
    ):
        reg.get("scale")
    assert not reg.is_loaded("scale")


def test_missing_file_is_refused(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"path": "gone.onnx"}))
    with pytest.raises(ModelLoadError, match=r"model 'scale' version '1': file .*gone.onnx does not exist"):
        reg.get("scale")


def test_a_file_that_is_not_onnx_is_refused(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"data": b"this is not a protobuf"}))
    with pytest.raises(ModelLoadError, match=r"model 'scale' version '1': .*model.onnx cannot be loaded"):
        reg.get("scale")


def test_specs_come_from_the_graph(write_manifest: ManifestWriter) -> None:
    model = registry(write_manifest({"data": model_bytes()})).get("scale")
    assert [(s.name, s.datatype, s.shape) for s in model.inputs] == [
        ("x", "FP32", (-1, 3)),
        ("k", "INT64", (-1,)),
    ]
    assert model.output_names == ("y", "k1")


def test_shape_overrides_apply_and_must_agree_with_the_graph(write_manifest: ManifestWriter) -> None:
    model = registry(write_manifest({"data": model_bytes(), "inputs": {"x": {"shape": [4, 3]}}})).get("scale")
    assert model.inputs[0].shape == (4, 3)
    for override, message in (
        ({"x": {"shape": [-1, 5]}}, "sets axis 1 to 5, graph fixes it at 3"),
        ({"x": {"shape": [-1]}}, "has rank 1, graph has 2"),
        ({"nope": {"shape": [1]}}, r"overrides unknown inputs \['nope'\]"),
    ):
        reg = registry(write_manifest({"data": model_bytes(), "inputs": override}))
        with pytest.raises(ModelLoadError, match=message):
            reg.get("scale")


def test_default_version_is_the_highest(write_manifest: ManifestWriter) -> None:
    reg = registry(
        write_manifest(
            {"data": model_bytes(), "version": "2"},
            {"data": model_bytes(), "version": "10"},
            {"data": model_bytes(), "version": "1"},
        )
    )
    assert reg.versions("scale") == ["1", "2", "10"]
    assert reg.resolve("scale").version == "10"
    assert reg.get("scale") is reg.get("scale", "10")


def test_unknown_models_and_versions_are_404s(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"data": model_bytes()}))
    with pytest.raises(ModelNotFound, match="model 'other' not found"):
        reg.get("other")
    with pytest.raises(ModelNotFound, match="model 'scale' has no version '7'; available: 1"):
        reg.get("scale", "7")
    assert ModelNotFound.status_code == 404


def test_thread_count_defaults_to_cpus_over_workers_and_per_model_wins(
    write_manifest: ManifestWriter,
) -> None:
    manifest = write_manifest({"data": model_bytes()}, {"data": model_bytes(), "name": "own", "intra_op_threads": 3})
    reg = registry(manifest, intra_op_threads=2)
    assert reg.get("scale").session.get_session_options().intra_op_num_threads == 2
    assert reg.get("own").session.get_session_options().intra_op_num_threads == 3


def test_remote_paths_need_a_fetcher(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"path": "s3://bucket/scale.onnx"}))
    with pytest.raises(ModelLoadError, match=r"no fetcher for s3:// paths"):
        reg.get("scale")


def test_remote_models_are_fetched_once_then_verified(write_manifest: ManifestWriter, tmp_path: Path) -> None:
    source = tmp_path / "remote.onnx"
    source.write_bytes(model_bytes())
    fetched: list[str] = []

    def fetch(uri: str, target: Path) -> Path:
        fetched.append(uri)
        shutil.copyfile(source, target)
        return target

    manifest = write_manifest({"path": "s3://bucket/scale.onnx", "sha256": hashlib.sha256(model_bytes()).hexdigest()})
    reg = registry(manifest, fetchers={"s3": fetch}, cache_dir=tmp_path / "cache")
    assert reg.get("scale").path == tmp_path / "cache/scale/1/model.onnx"
    registry(manifest, fetchers={"s3": fetch}, cache_dir=tmp_path / "cache").get("scale")
    assert fetched == ["s3://bucket/scale.onnx"]


def test_unknown_execution_providers_are_refused(write_manifest: ManifestWriter) -> None:
    reg = registry(write_manifest({"data": model_bytes(), "execution_providers": ["WarpDriveExecutionProvider"]}))
    with pytest.raises(ModelLoadError, match="unknown execution providers"):
        reg.get("scale")


def test_a_gpu_provider_this_onnxruntime_lacks_stops_the_load(write_manifest: ManifestWriter) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    reg = registry(
        write_manifest(
            {"data": model_bytes(), "execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
        )
    )
    with pytest.raises(ModelLoadError, match=r"\['CUDAExecutionProvider'\] are not in this build.*cpu_fallback = true"):
        reg.get("scale")


def test_cpu_fallback_runs_on_the_cpu_and_says_so(
    write_manifest: ManifestWriter, caplog: pytest.LogCaptureFixture
) -> None:
    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the TensorRT provider")
    reg = registry(
        write_manifest(
            {
                "data": model_bytes(),
                "execution_providers": [{"name": "TensorrtExecutionProvider", "fp16": True}, "CPUExecutionProvider"],
                "cpu_fallback": True,
            }
        )
    )
    loaded = reg.get("scale")
    assert loaded.session.get_providers() == ["CPUExecutionProvider"]
    assert loaded.placement.device == "cpu"
    assert loaded.placement.fallback is not None and "TensorrtExecutionProvider" in loaded.placement.fallback
    assert "TensorrtExecutionProvider" in caplog.text and "running on ['CPUExecutionProvider']" in caplog.text


def test_a_cpu_worker_of_a_mixed_pool_runs_a_gpu_model_on_its_cpu_providers(
    write_manifest: ManifestWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FNSERVE_DEVICE", "cpu")
    providers = [{"name": "CUDAExecutionProvider", "device_id": 0}, "CPUExecutionProvider"]
    loaded = registry(write_manifest({"data": model_bytes(), "execution_providers": providers})).get("scale")
    assert loaded.session.get_providers() == ["CPUExecutionProvider"]
    assert loaded.placement.device == "cpu" and loaded.placement.fallback is None  # placed there, not fallen back
