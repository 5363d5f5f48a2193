from __future__ import annotations

import hashlib
import re
import shutil
import threading
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tomli_w

from fnserve.core.errors import ConfigError, ModelLoadError, ModelNotFound
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.providers import Placement, cuda_graphs, ort_providers
from fnserve.core.models.registry import ModelRegistry
from fnserve.core.models.shape_sessions import GraphSession, ShapeSessions, shape_key
from tests.helpers import DEMO_HOLDOUT, DIGITS_ACCURATE, ManifestWriter, model_bytes, save_with_external_data


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
    with pytest.raises(ConfigError, match=r"model 'scale' \(models.0\) max_batch_size: Expected `int` >= 1"):
        load_manifest(manifest)
    text = re.sub(r'sha256 = "[0-9a-f]+"', 'sha256 = "abc"', manifest.read_text())
    manifest.write_text(text.replace("max_batch_size = 0", ""))
    with pytest.raises(ConfigError, match=r"model 'scale' \(models.0\): sha256 must be 64 hex"):
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
    with pytest.raises(ModelNotFound, match="Request for unknown model: 'other' is not found"):
        reg.get("other")
    with pytest.raises(ModelNotFound, match="Request for unknown model: 'scale' version 7 is not found; available: 1"):
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


def test_a_cpu_worker_of_a_mixed_pool_runs_a_gpu_model_on_its_cpu_providers(write_manifest: ManifestWriter) -> None:
    providers = [{"name": "CUDAExecutionProvider", "device_id": 0}, "CPUExecutionProvider"]
    manifest = write_manifest({"data": model_bytes(), "execution_providers": providers})
    loaded = registry(manifest, cpu_only=True).get("scale")
    assert loaded.session.get_providers() == ["CPUExecutionProvider"]
    assert loaded.placement.device == "cpu" and loaded.placement.fallback is None  # placed there, not fallen back


def shaped_manifest(write_manifest: ManifestWriter, **settings: object) -> Path:
    return write_manifest(
        {"data": model_bytes(), "max_batch_size": 8, "max_batch_time_ms": 1, "batch_buckets": [1, 4], **settings}
    )


def feed(rows: int, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 3), dtype=np.float32), "k": rng.integers(0, 9, rows, dtype=np.int64)}


def test_a_session_per_shape_runs_each_batch_shape_on_its_own_session(
    write_manifest: ManifestWriter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    loaded = registry(shaped_manifest(write_manifest, session_per_shape=True)).get("scale")
    assert isinstance(loaded.session, ShapeSessions) and len(loaded.session) == 2
    assert "2 sessions, one per shape" in caplog.text
    assert loaded.session.get_providers() == ["CPUExecutionProvider"]  # what the placement checks read
    used: list[int] = []

    class Recording:
        def __init__(self, session: Any) -> None:
            self.session = session

        def run(self, names: list[str], f: dict[str, Any]) -> list[Any]:
            used.append(id(self.session))
            return self.session.run(names, f)  # type: ignore[no-any-return]

    sessions = loaded.session._sessions
    first = sessions[shape_key(feed(1, 0), ["x", "k"])]
    loaded.session._first = Recording(first)
    sessions.update({key: loaded.session._first if s is first else Recording(s) for key, s in sessions.items()})
    for rows in (1, 4, 1, 3):  # 3 is no bucket: it still runs, on the first session
        f = feed(rows, rows)
        y, k1 = loaded.session.run(["y", "k1"], f)
        np.testing.assert_array_equal(y, 2 * f["x"])
        np.testing.assert_array_equal(k1, f["k"] + 1)
    assert len(set(used)) == 2 and used[0] == used[2] == used[3] != used[1]


def test_length_buckets_that_pad_nothing_make_no_extra_sessions(
    write_manifest: ManifestWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = []
    session_class = ort.InferenceSession

    def counted(*args: Any, **kwargs: Any) -> ort.InferenceSession:
        created.append(1)
        return session_class(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counted)
    manifest = shaped_manifest(write_manifest, session_per_shape=True, length_buckets=[8, 16])
    loaded = registry(manifest).get("scale")
    assert isinstance(loaded.session, ShapeSessions) and len(loaded.session) == 2
    assert len(created) == 2  # batch 1 and 4, once each: the lengths change no shape of this model


def test_a_graph_session_replays_fixed_buffers_without_mixing_calls(write_manifest: ManifestWriter) -> None:
    # The CUDA graph path's buffers and bindings, on the CPU provider (which ignores the graph ids).
    plain = registry(write_manifest({"data": model_bytes()})).get("scale").session
    keys = [shape_key(feed(rows, 0), ["x", "k"]) for rows in (1, 4)]
    graphs = GraphSession(plain, keys, "cpu")
    answers = []
    for seed, rows in enumerate((4, 1, 4, 4, 2)):
        f = feed(rows, seed)
        answers.append((f, graphs.run(["y", "k1"], f)))
    assert len(graphs) == 2  # shapes 4 and 1 captured once each; 2 ran without capture
    for f, (y, k1) in answers:  # each answer is its own, not the buffer a later call overwrote
        np.testing.assert_array_equal(y, 2 * f["x"])
        np.testing.assert_array_equal(k1, f["k"] + 1)
    (k1_only,) = graphs.run(["k1"], feed(1, 9))
    np.testing.assert_array_equal(k1_only, feed(1, 9)["k"] + 1)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"session_per_shape": True, "batch_buckets": []}, "session_per_shape needs batch_buckets"),
        ({"cuda": True, "batch_buckets": []}, "cuda_graph needs batch_buckets"),
        ({"cuda": True, "session_per_shape": True}, "cuda_graph already keeps one graph per shape"),
    ],
)
def test_per_shape_settings_need_fixed_shapes(
    write_manifest: ManifestWriter, settings: dict[str, Any], error: str
) -> None:
    if settings.pop("cuda", False):
        cuda = {"name": "CUDAExecutionProvider", "cuda_graph": True}
        settings["execution_providers"] = [cuda, "CPUExecutionProvider"]
    with pytest.raises(ConfigError, match=error):
        load_manifest(shaped_manifest(write_manifest, **settings))


def test_cuda_graph_asks_onnxruntime_for_graph_capture(write_manifest: ManifestWriter) -> None:
    providers = [{"name": "CUDAExecutionProvider", "cuda_graph": True}, "CPUExecutionProvider"]
    settings = load_manifest(shaped_manifest(write_manifest, execution_providers=providers)).models[0]
    chosen, _ = ort_providers(settings.replace(cpu_fallback=True), "here")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert chosen[0][1]["enable_cuda_graph"] == "1"  # type: ignore[index]
    assert not cuda_graphs(settings, Placement(("CPUExecutionProvider",), "cpu"))
    assert cuda_graphs(settings, Placement(("CUDAExecutionProvider", "CPUExecutionProvider"), "cuda:0"))


def test_every_model_loads_at_once_on_the_cpu_each_on_its_own_thread(
    write_manifest: ManifestWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = registry(write_manifest(*({"name": f"m{i}", "data": model_bytes()} for i in range(3))))
    monkeypatch.setattr("fnserve.core.models.registry.available_cpus", lambda: 2)
    load = ModelRegistry._load
    inside: list[str] = []
    both = threading.Barrier(2, timeout=10)  # two loads in flight at once, or the barrier breaks

    def traced(self: ModelRegistry, settings: Any) -> Any:
        inside.append(threading.current_thread().name)
        if len(inside) <= 2:
            both.wait()
        return load(self, settings)

    monkeypatch.setattr(ModelRegistry, "_load", traced)
    reg.load_all()
    assert all(reg.is_loaded(f"m{i}") for i in range(3))
    assert len(inside) == 3 and all(name.startswith("fnserve-load") for name in inside), inside


def test_a_load_error_stops_the_parallel_load_with_the_first_models_error(write_manifest: ManifestWriter) -> None:
    reg = registry(
        write_manifest(
            {"name": "good", "data": model_bytes()},
            {"name": "bad", "data": model_bytes(), "sha256": "f" * 64},
            {"name": "worse", "data": b"not onnx"},
        )
    )
    with pytest.raises(ModelLoadError, match=r"model 'bad' version '1': .* but the manifest says f{64}"):
        reg.load_all()


def test_models_that_may_go_to_a_gpu_load_one_at_a_time(
    write_manifest: ManifestWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = registry(write_manifest(*({"name": f"m{i}", "data": model_bytes()} for i in range(2))))
    assert not reg._may_use_gpu()
    monkeypatch.setattr(reg, "_may_use_gpu", lambda: True)
    threads: list[str] = []
    load = ModelRegistry._load
    monkeypatch.setattr(
        ModelRegistry, "_load", lambda self, s: (threads.append(threading.current_thread().name), load(self, s))[1]
    )
    reg.load_all()
    assert threads == [threading.main_thread().name] * 2


# External data: a graph whose tensors are in a file beside it, as the manifest's external_data lists it.
DIGITS = np.load(DEMO_HOLDOUT)["input"][:8]
PLAIN = ort.InferenceSession(str(DIGITS_ACCURATE)).run(None, {"input": DIGITS})


def external_manifest(directory: Path, listed: bool = True, **settings: object) -> Path:
    """A manifest of digits-accurate saved with external data (``ext``, its data file listed unless not
    ``listed``) and as it ships (``plain``)."""
    data_file = save_with_external_data(directory / "ext" / "1" / "model.onnx")
    ext: dict[str, object] = {"name": "ext", "path": "ext/1/model.onnx", **settings}
    ext["sha256"] = hashlib.sha256((directory / "ext" / "1" / "model.onnx").read_bytes()).hexdigest()
    if listed:
        ext["external_data"] = {data_file.name: hashlib.sha256(data_file.read_bytes()).hexdigest()}
    plain = {
        "name": "plain",
        "path": str(DIGITS_ACCURATE),
        "sha256": hashlib.sha256(DIGITS_ACCURATE.read_bytes()).hexdigest(),
    }
    manifest = directory / "manifest.toml"
    manifest.write_text(tomli_w.dumps({"models": [ext, plain]}))
    return manifest


@pytest.mark.parametrize(
    "settings",
    [{}, {"session_per_shape": True, "max_batch_time_ms": 1, "max_batch_size": 8, "batch_buckets": [1, 8]}],
    ids=["one-session", "session-per-shape"],
)
def test_a_graph_with_external_data_loads_from_its_checked_file_and_answers_as_without(
    tmp_path: Path, settings: dict[str, object]
) -> None:
    manifest = external_manifest(tmp_path / "models", **settings)
    assert (tmp_path / "models" / "ext" / "1" / "model.onnx").stat().st_size < 10_000  # the weights are beside it
    loaded = registry(manifest).get("ext")
    if settings:  # each session made from the same checked bytes
        assert isinstance(loaded.session, ShapeSessions) and len(loaded.session) == 2
    for rows in (1, 8):
        answered = loaded.session.run(["label", "probabilities"], {"input": DIGITS[:rows]})
        for got, want in zip(answered, PLAIN, strict=True):
            np.testing.assert_allclose(got, want[:rows], rtol=1e-6)


def test_a_tampered_or_missing_data_file_is_refused_naming_it_and_the_others_load(tmp_path: Path) -> None:
    manifest = external_manifest(tmp_path)
    data_file = tmp_path / "ext" / "1" / "model.onnx.data"
    data_file.write_bytes(data_file.read_bytes()[:-4] + b"\0\0\0\0")
    reg = registry(manifest)
    with pytest.raises(
        ModelLoadError, match=rf"model 'ext' version '1': file {data_file} has sha256 [0-9a-f]{{64}}, but the manifest"
    ):
        reg.get("ext")
    assert reg.get("plain").session.run(["label"], {"input": DIGITS})[0].tolist() == PLAIN[0].tolist()
    data_file.unlink()
    with pytest.raises(ModelLoadError, match=rf"model 'ext' version '1': file {data_file} does not exist"):
        registry(manifest).get("ext")


def test_a_data_file_the_manifest_does_not_list_is_refused_saying_to_list_it_and_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = external_manifest(tmp_path / "models", listed=False)
    # One in the working directory too: onnxruntime reads such a file there when it is given no table.
    shutil.copyfile(tmp_path / "models" / "ext" / "1" / "model.onnx.data", tmp_path / "model.onnx.data")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ModelLoadError,
        match=r"model 'ext' version '1': its graph keeps tensors in 'model.onnx.data' beside model.onnx, which the "
        r"manifest does not list: name it under external_data with its sha256 \(`fnserve manifest add` does\)",
    ):
        registry(manifest).get("ext")


def test_external_data_names_stay_below_the_model_and_their_sha256s_are_hex(tmp_path: Path) -> None:
    digest = "AB" * 32
    base = {"name": "m", "path": "m.onnx", "sha256": "0" * 64}
    entry = ModelSettings.validate(base | {"external_data": {"./weights/w.bin": digest}})
    assert entry.external_data == {"weights/w.bin": digest.lower()}
    for name in ("../w.bin", "/tmp/w.bin", "a/../../w.bin", "", ".", "w\\x.bin"):
        with pytest.raises(ValueError, match="must be a relative path below the model's folder"):
            ModelSettings.validate(base | {"external_data": {name: digest}})
    with pytest.raises(ValueError, match="external_data 'w.bin': sha256 must be 64 hex digits"):
        ModelSettings.validate(base | {"external_data": {"w.bin": "abc"}})


def test_remote_data_files_are_fetched_beside_the_model_in_the_cache(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    external_manifest(bucket)  # the files as a bucket would hold them
    entry = tomllib.loads((bucket / "manifest.toml").read_text())["models"][0] | {
        "path": "s3://bucket/ext/1/model.onnx"
    }
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(tomli_w.dumps({"models": [entry]}))
    fetched: list[str] = []

    def fetch(uri: str, target: Path) -> Path:
        fetched.append(uri)
        shutil.copyfile(bucket / uri.removeprefix("s3://bucket/"), target)
        return target

    loaded = registry(manifest, fetchers={"s3": fetch}, cache_dir=tmp_path / "cache").get("ext")
    assert fetched == ["s3://bucket/ext/1/model.onnx", "s3://bucket/ext/1/model.onnx.data"]
    assert (tmp_path / "cache" / "ext" / "1" / "model.onnx.data").is_file()
    np.testing.assert_array_equal(loaded.session.run(["label"], {"input": DIGITS})[0], PLAIN[0])
