from __future__ import annotations

import pytest
from msgspec import ValidationError

from fnserve.core import host as _cpus
from fnserve.core.errors import ConfigError
from fnserve.core.models.manifest.loading import Manifest
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.settings import Settings

SHA = "a" * 64


def model(**fields: object) -> ModelSettings:
    return ModelSettings.validate({"name": "m", "path": "m.onnx", "sha256": SHA, **fields})


@pytest.mark.parametrize(
    "name", ["../etc", "a/b", "a b", "", ".hidden", "x" * 129, "a..b", "trailing.", "%2e%2e", "m?x=1"]
)
def test_model_names_that_could_escape_a_path_or_url_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="name"):
        model(name=name)


@pytest.mark.parametrize("name", ["digits-fast", "resnet50_v1.5", "A", "m2"])
def test_ordinary_model_names_are_accepted(name: str) -> None:
    assert model(name=name).name == name


def test_versions_are_validated_like_names() -> None:
    with pytest.raises(ValidationError, match="model version '../1'"):
        model(version="../1")


def test_sha256_must_be_64_hex_digits_and_is_lowercased() -> None:
    assert model(sha256="A" * 64).sha256 == "a" * 64
    with pytest.raises(ValidationError, match="sha256 must be 64 hex digits"):
        model(sha256="abc")


@pytest.mark.parametrize("path", ["s3://bucket", "s3:///key", ""])
def test_bad_model_paths_are_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="path"):
        model(path=path)


def test_shape_override_dimensions_must_be_positive_or_minus_one() -> None:
    with pytest.raises(ValidationError, match="input 'x': shape dimensions must be positive or -1"):
        model(inputs={"x": {"shape": [0, 3]}})


def test_unknown_model_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="max_batch"):
        model(max_batch=4)


def test_duplicate_model_versions_are_refused() -> None:
    entry = {"name": "m", "path": "m.onnx", "sha256": SHA}
    with pytest.raises(ValidationError, match="model 'm' version '1' is listed twice"):
        Manifest.validate({"models": [entry, entry]})


def test_settings_read_fnserve_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FNSERVE_MANIFEST", "/models/m.toml")
    monkeypatch.setenv("FNSERVE_PARALLEL_WORKERS", "0")
    monkeypatch.setenv("FNSERVE_EAGER_LOAD", "true")
    settings = Settings()
    assert str(settings.manifest) == "/models/m.toml"
    assert settings.parallel_workers == 0
    assert settings.eager_load is True


def test_constructor_values_beat_the_environment_and_both_count_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FNSERVE_MANIFEST", "/from/env.toml")
    monkeypatch.setenv("fnserve_access_log", "yes")  # names are case-insensitive, as pydantic-settings read them
    monkeypatch.setenv("FNSERVE_RESULT_ID_KEY", "s3cret")
    monkeypatch.setenv("FNSERVE_NOT_A_SETTING", "ignored")
    settings = Settings(manifest="/given.toml")
    assert settings.manifest == "/given.toml" and settings.access_log is True
    assert settings.result_id_key is not None and settings.result_id_key.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert {"manifest", "access_log", "result_id_key"} <= settings.fields_set
    assert "parallel_workers" not in settings.fields_set  # what `fnserve serve` chooses by itself


def test_a_bad_environment_value_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FNSERVE_MAX_REQUEST_BYTES", "lots")
    with pytest.raises(ConfigError, match="FNSERVE_MAX_REQUEST_BYTES='lots': Expected `int`"):
        Settings()


def test_oversubscribing_threads_is_refused_naming_both_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cpus, "available_cpus", lambda: 4)
    monkeypatch.setattr("fnserve.settings.available_cpus", lambda: 4)
    assert Settings(intra_op_threads=2, parallel_workers=2).intra_op_threads == 2
    with pytest.raises(ConfigError, match="FNSERVE_INTRA_OP_THREADS=3 x 2 processes .*PARALLEL_WORKERS=2"):
        Settings(intra_op_threads=3, parallel_workers=2)
    # Front processes multiply the workers: 2 servers x 2 workers x 2 threads is 8 threads on 4 CPUs.
    with pytest.raises(ConfigError, match="x 4 processes .*SERVER_PROCESSES=2, FNSERVE_PARALLEL_WORKERS=2"):
        Settings(intra_op_threads=2, parallel_workers=2, server_processes=2)
    assert Settings(intra_op_threads=2, parallel_workers=0, server_processes=2).inference_processes == 2


def test_negative_workers_are_refused() -> None:
    with pytest.raises(ConfigError, match="FNSERVE_PARALLEL_WORKERS=-1: Expected `int` >= 0"):
        Settings(parallel_workers=-1)


@pytest.mark.parametrize(("cpus", "workers", "threads"), [(8, 1, 8), (8, 2, 4), (8, 3, 2), (2, 4, 1), (1, 0, 1)])
def test_default_threads_never_oversubscribe(cpus: int, workers: int, threads: int) -> None:
    assert _cpus.default_intra_op_threads(workers, cpus=cpus) == threads
    assert threads * max(1, workers) <= cpus or threads == 1


def test_available_cpus_honours_a_cgroup_quota(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(_cpus, "_CGROUP_CPU_MAX", cpu_max)
    monkeypatch.setattr(_cpus.os, "sched_getaffinity", lambda pid: set(range(16)))
    cpu_max.write_text("150000 100000\n")
    assert _cpus.available_cpus() == 2
    cpu_max.write_text("max 100000\n")
    assert _cpus.available_cpus() == 16


def test_settings_cross_to_a_child_process_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's resolved settings, secrets included, are what its front processes and workers read, whatever
    FNSERVE_* variables they also inherit; a child's own arguments still win."""
    monkeypatch.setenv("FNSERVE_LOG_LEVEL", "DEBUG")  # the server's environment said so; its flags said otherwise
    parent = Settings(manifest="/m.toml", log_level="WARNING", parallel_workers=0, result_id_key="s3cret", device="cpu")
    for key, value in parent.to_env().items():
        monkeypatch.setenv(key, value)
    child = Settings()
    assert child == parent
    assert child.result_id_key is not None and child.result_id_key.get_secret_value() == "s3cret"
    assert Settings(log_level="ERROR").log_level == "ERROR"


@pytest.mark.parametrize("value", ["", "off", "OFF", " off "])
def test_grpc_can_be_turned_off_over_an_images_port(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FNSERVE_GRPC_PORT", value)
    assert Settings().grpc_port is None
    monkeypatch.setenv("FNSERVE_GRPC_PORT", "8081")
    assert Settings().grpc_port == 8081
    monkeypatch.setenv("FNSERVE_GRPC_PORT", "of")
    with pytest.raises(ConfigError, match="FNSERVE_GRPC_PORT='of'"):
        Settings()


@pytest.mark.parametrize(("word", "value"), [("yes", True), ("On", True), ("1", True), ("no", False), ("off", False)])
def test_a_boolean_setting_reads_the_words_people_write(
    word: str, value: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FNSERVE_ACCESS_LOG", word)
    assert Settings().access_log is value
    monkeypatch.setenv("FNSERVE_ACCESS_LOG", "maybe")
    with pytest.raises(ConfigError, match="FNSERVE_ACCESS_LOG='maybe': Expected `bool`"):
        Settings()


def test_a_refused_secret_is_named_but_not_shown() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings(result_id_key=12345678)
    assert str(refused.value).startswith("FNSERVE_RESULT_ID_KEY: Expected") and "12345678" not in str(refused.value)


def test_a_copy_is_validated_counts_its_changes_as_set_and_reads_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(manifest="/m.toml")
    monkeypatch.setenv("FNSERVE_LOG_LEVEL", "DEBUG")
    copy = settings.replace(parallel_workers=0)
    assert copy.parallel_workers == 0 and copy.log_level == settings.log_level
    assert "parallel_workers" in copy.fields_set and "parallel_workers" not in settings.fields_set
    with pytest.raises(ConfigError, match="FNSERVE_PARALLEL_WORKERS=-2"):
        settings.replace(parallel_workers=-2)
