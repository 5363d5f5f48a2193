"""fnserve bench's logic: configurations, the staged search, the stop rule, the recommendation, the requests
it builds, the manifest each configuration's server gets, Lambda's CPU share and cost, CPU pinning."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fnserve.bench import requests as made
from fnserve.bench import sizing, sweep
from fnserve.bench.floor import tile
from fnserve.bench.sweep import Config, LoadOptions, Point, Result
from fnserve.bench.tuner import resolve
from fnserve.core.errors import InvalidInput
from fnserve.core.execution.service import InferenceService
from fnserve.core.host import pin_process, slot_cpus
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.registry import ModelRegistry
from tests.helpers import DEMO_MANIFEST


def point(concurrency: int, rate: float, p99: float = 1.0, errors: int = 0, p50: float = 0.5) -> Point:
    return Point(concurrency, rate, p50, p99 * 0.8, p99, errors, 0.1, "built-in")


# -- configurations and stages -------------------------------------------------------------------------


def test_a_configuration_becomes_serve_options_environment_and_a_snippet() -> None:
    config = Config(processes=2, workers=0, threads=1, pin=True, batch_time_ms=2.0, batch_size=16)
    assert config.serve_args() == ["--processes", "2", "--workers", "0", "--cpu-affinity"]
    assert config.env() == {"FNSERVE_INTRA_OP_THREADS": "1"}
    assert config.inference_processes == 2
    assert config.label() == "2 proc 0 wkr 1 thr pinned batch 16/2ms"
    text = config.snippet(Path("/m/manifest.toml"), "digits", "digits")
    command = "FNSERVE_INTRA_OP_THREADS=1 fnserve serve -m /m/manifest.toml --processes 2 --workers 0 --cpu-affinity"
    assert command in text
    assert "FNSERVE_CPU_AFFINITY=true" in text and "FNSERVE_MANIFEST=/m/manifest.toml" in text
    assert "max_batch_time_ms = 2\nmax_batch_size = 16" in text
    assert "batching off" in Config().snippet(Path("m.toml"), "t", "t")
    assert Config(processes=1, workers=3).inference_processes == 3


def test_the_layout_stage_measures_one_process_then_one_per_cpu() -> None:
    assert sweep.layouts(1) == [Config(1, 0), Config(1, 1)]
    assert sweep.layouts(4) == [Config(1, 0), Config(1, 1), Config(4, 0), Config(1, 4)]


def test_the_threads_stage_tries_fewer_threads_for_one_process_and_pinning_for_several() -> None:
    assert sweep.tunings(Config(1, 0), 4) == [Config(1, 0, threads=1), Config(1, 0, threads=2)]
    assert sweep.pinning(Config(2, 0), 2) == [Config(2, 0, pin=True)]
    assert sweep.pinning(Config(1, 0, threads=1), 2) == [Config(1, 0, threads=1, pin=True)]
    assert sweep.tunings(Config(1, 0), 1) == [] and sweep.pinning(Config(1, 0), 1) == []  # one CPU: nothing to tune


def test_the_batching_stage_keeps_to_the_models_largest_batch_and_tries_the_manifests_own() -> None:
    found = sweep.batchings(Config(2, 0), max_batch_size=16, manifest_batches=True)
    assert found[0] == Config(2, 0, manifest_batching=True)
    assert [(c.batch_time_ms, c.batch_size) for c in found[1:]] == [(1.0, 8), (2.0, 16)]


# -- the stop rule and the recommendation --------------------------------------------------------------


class _Scripted:
    def __init__(self, rates: dict[int, float], errors_at: int | None = None) -> None:
        self.rates, self.errors_at = rates, errors_at
        self.levels: list[int] = []

    def __call__(self, server: Any, target: str, requests: Any, concurrency: int, options: LoadOptions) -> Point:
        self.levels.append(concurrency)
        return point(concurrency, self.rates.get(concurrency, 0.0), errors=int(concurrency == self.errors_at))


def test_saturation_stops_at_the_first_level_that_does_not_raise_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = _Scripted({1: 100, 2: 190, 4: 350, 8: 500, 16: 510, 32: 900})
    monkeypatch.setattr(sweep, "measure_point", scripted)
    points = sweep.saturate(None, "m", [], LoadOptions(max_concurrency=64))  # type: ignore[arg-type]
    assert [p.concurrency for p in points] == [1, 2, 4, 8, 16]  # 510 < 500 x 1.05: saturated at 8
    assert scripted.levels[0] == 2  # the discarded warm-up


def test_saturation_measures_at_least_three_levels_and_stops_at_errors_and_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sweep, "measure_point", _Scripted({1: 100, 2: 100, 4: 100, 8: 100}))
    assert len(sweep.saturate(None, "m", [], LoadOptions())) == 3  # type: ignore[arg-type]
    monkeypatch.setattr(sweep, "measure_point", _Scripted({1: 100, 2: 200, 4: 400}, errors_at=4))
    assert [p.errors for p in sweep.saturate(None, "m", [], LoadOptions())] == [0, 0, 1]  # type: ignore[arg-type]
    monkeypatch.setattr(sweep, "measure_point", _Scripted({c: c * 100.0 for c in sweep.LEVELS}))
    points = sweep.saturate(None, "m", [], LoadOptions(max_concurrency=16))  # type: ignore[arg-type]
    assert [p.concurrency for p in points] == [1, 2, 4, 8, 16]


def test_the_recommendation_is_the_most_throughput_within_the_p99_budget_without_errors() -> None:
    fast_but_slow_tail = Result(Config(2, 0), "layout", [point(1, 1000, p99=2), point(8, 5000, p99=20)])
    steady = Result(Config(1, 0), "layout", [point(1, 900, p99=1), point(8, 3000, p99=4)])
    failing = Result(Config(1, 2), "layout", [point(1, 9000, p99=1, errors=3)])
    broken = Result(Config(1, 1), "layout", error="out of memory")
    results = [fast_but_slow_tail, steady, failing, broken]
    assert sweep.best_config(results, None) is fast_but_slow_tail
    assert sweep.best_config(results, 5.0) is steady
    assert steady.best(5.0) == steady.points[1]
    assert sweep.best_config(results, 0.5) is None
    assert failing.best() is None and broken.best() is None


# -- the server's manifest -----------------------------------------------------------------------------


def test_each_configuration_serves_its_target_alone_without_a_result_cache(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    manifest = source / "manifest.toml"
    manifest.write_text(
        '[[models]]\nname = "a"\npath = "a.onnx"\nsha256 = "' + "0" * 64 + '"\ncache_ttl_seconds = 60\n'
        "max_batch_time_ms = 3\nlength_buckets = [8, 16]\nmax_batch_size = 8\n"
        '[[models]]\nname = "b"\npath = "b.onnx"\nsha256 = "' + "1" * 64 + '"\n'
        '[[pipelines]]\nname = "p"\nmodel = "a"\ncache_ttl_seconds = 60\n[[pipelines.pre]]\nstep = "softmax"\n'
        'input = "x"\n'
    )
    plain = json.loads(sweep.variant_manifest(manifest, "b", Config(), tmp_path).read_text())
    assert [m["name"] for m in plain["models"]] == ["b"] and plain["pipelines"] == []
    assert plain["base_dir"] == str(source.resolve())

    batching = Config(batch_time_ms=1, batch_size=16)
    batched = json.loads(sweep.variant_manifest(manifest, "p", batching, tmp_path).read_text())
    (model,) = batched["models"]
    assert model["name"] == "a" and "cache_ttl_seconds" not in model
    assert model["length_buckets"] == [8, 16]  # the manifest's padding, kept for the configuration's batching
    assert model["max_batch_time_ms"] == 1 and model["max_batch_size"] == 8  # never over the model's own
    assert [p["name"] for p in batched["pipelines"]] == ["p"] and "cache_ttl_seconds" not in batched["pipelines"][0]

    own = json.loads(sweep.variant_manifest(manifest, "a", Config(manifest_batching=True), tmp_path).read_text())
    assert own["models"][0]["max_batch_time_ms"] == 3 and own["models"][0]["length_buckets"] == [8, 16]
    unbatched = json.loads(sweep.variant_manifest(manifest, "a", Config(), tmp_path).read_text())
    assert "max_batch_time_ms" not in unbatched["models"][0]


def test_the_variant_manifest_of_a_demo_pipeline_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = DEMO_MANIFEST.read_bytes()
    monkeypatch.chdir(DEMO_MANIFEST.parents[3])  # the manifest named relative to the working directory
    relative = DEMO_MANIFEST.relative_to(DEMO_MANIFEST.parents[3])
    path = sweep.variant_manifest(relative, "digits-image", Config(batch_time_ms=2, batch_size=16), tmp_path)
    loaded = load_manifest(path)
    assert [m.name for m in loaded.models] == ["digits-accurate"] and loaded.models[0].max_batch_time_ms == 2
    assert [p.name for p in loaded.pipelines] == ["digits-image"]
    service = InferenceService(ModelRegistry(loaded))
    assert service.servable("digits-image").name == "digits-image"  # its labels file resolves against the demo's folder
    assert DEMO_MANIFEST.read_bytes() == before


def test_a_token_budgeted_model_loads_with_batching_off(tmp_path: Path) -> None:
    path = sweep.variant_manifest(DEMO_MANIFEST, "minilm-embed", Config(), tmp_path)  # --lambda's, --targets'
    model = load_manifest(path).models[0]
    assert model.name == "minilm-l6" and model.max_batch_time_ms is None
    assert model.max_batch_tokens is None and model.max_batch_attention is None


# -- requests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> InferenceService:
    return InferenceService.from_manifest(DEMO_MANIFEST)


def test_requests_from_metadata_are_distinct_valid_v2_json(demo: InferenceService) -> None:
    target = resolve(demo, "digits-accurate")
    found = made.synthetic(target, rows=2, count=4)
    bodies = [json.loads(r.body) for r in found]
    assert len({r.body for r in found}) == 4
    assert bodies[0]["inputs"][0]["shape"] == [2, 64] and bodies[0]["inputs"][0]["datatype"] == "FP32"
    sent = np.array(bodies[0]["inputs"][0]["data"], np.float32).reshape(2, 64)
    outputs = demo.predict("digits-accurate", {"input": sent})
    assert outputs["probabilities"].shape == (2, 10)
    assert target.model_feed(found[0].inputs)["input"].shape == (2, 64)


def test_image_pipeline_requests_carry_jpegs_in_the_binary_extension(demo: InferenceService) -> None:
    target = resolve(demo, "digits-image")
    request = made.synthetic(target, rows=1, count=1)[0]
    assert request.headers["Content-Type"] == "application/octet-stream"
    head = int(request.headers["Inference-Header-Content-Length"])
    spec = json.loads(request.body[:head])["inputs"][0]
    assert spec["datatype"] == "BYTES" and request.body[head + 4 : head + 6] == b"\xff\xd8"  # a JPEG
    assert target.model_feed(request.inputs)["input"].shape == (1, 64)  # the image step ran


def test_requests_from_a_data_file_and_from_request_files(demo: InferenceService, tmp_path: Path) -> None:
    target = resolve(demo, "digits-accurate")
    np.savez(tmp_path / "x.npz", input=np.arange(5 * 64, dtype=np.float32).reshape(5, 64))
    found = made.from_data(target, tmp_path / "x.npz", rows=2)
    assert [r.rows for r in found] == [2, 2]
    with pytest.raises(InvalidInput, match="fewer than"):
        made.from_data(target, tmp_path / "x.npz", rows=6)
    (tmp_path / "r.json").write_bytes(found[0].body)
    (again,) = made.from_files(target, [tmp_path / "r.json"])
    np.testing.assert_array_equal(again.inputs["input"], found[0].inputs["input"])
    (tmp_path / "bad.json").write_text('{"inputs": [{"name": "nope"}]}')
    with pytest.raises(InvalidInput, match="not a V2 JSON request"):
        made.from_files(target, [tmp_path / "bad.json"])


def test_a_target_must_be_a_model_or_a_pipeline(demo: InferenceService) -> None:
    with pytest.raises(InvalidInput, match="cascade"):
        resolve(demo, "digits")
    with pytest.raises(InvalidInput, match="no model or pipeline"):
        resolve(demo, "nope")
    with pytest.raises(InvalidInput, match="choose one with --model"):
        resolve(demo, None)


def test_tile_repeats_rows_to_a_batch() -> None:
    feed = {"x": np.arange(6).reshape(3, 2)}
    assert tile(feed, 7)["x"].shape == (7, 2) and tile(feed, 7)["x"][3].tolist() == [0, 1]
    assert tile(feed, 2)["x"].shape == (2, 2)


# -- Lambda sizes ---------------------------------------------------------------------------------------


def test_lambda_cpu_grows_with_memory_and_the_cheapest_size_that_fits_is_chosen() -> None:
    assert sizing.vcpus(1769) == 1.0 and sizing.vcpus(512) == pytest.approx(0.289, abs=1e-3)
    assert sizing.vcpus(10240) == 6

    def size(memory: int, p99: float, cost: float, peak: float = 100) -> sizing.Size:
        return sizing.Size(memory, sizing.vcpus(memory), 1, 10, 1, p99, 1, cost, peak, 100)

    small, fits, big = size(128, 5, 0.1, peak=200), size(512, 9, 0.3), size(1769, 2, 0.4)
    assert not small.fits
    assert sizing.cheapest([small, fits, big], None) is fits
    assert sizing.cheapest([small, fits, big], 3.0) is big
    assert sizing.cheapest([small], None) is None


# -- CPU pinning -------------------------------------------------------------------------------------


def test_slots_split_the_cpus_evenly_and_wrap_when_there_are_more_slots() -> None:
    assert [slot_cpus([0, 1, 2, 3], 2, s) for s in range(2)] == [[0, 1], [2, 3]]
    assert [slot_cpus([4, 5], 4, s) for s in range(4)] == [[4], [5], [4], [5]]
    assert slot_cpus([0, 1, 2], 1, 0) == [0, 1, 2]


def _pinned(directory: str, slots: int, cpus: list[int], hold: Any, out: Any) -> None:
    slot, chosen = pin_process(directory, slots, cpus)
    out.put((slot, chosen, sorted(os.sched_getaffinity(0))))
    hold.wait()


def test_each_process_claims_a_free_slot_and_a_replacement_gets_the_freed_one(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    holds = [context.Event() for _ in range(3)]
    first = context.Process(target=_pinned, args=(str(tmp_path), 2, cpus, holds[0], out))
    second = context.Process(target=_pinned, args=(str(tmp_path), 2, cpus, holds[1], out))
    first.start()
    a = out.get(timeout=60)
    second.start()
    b = out.get(timeout=60)
    assert {a[0], b[0]} == {0, 1}
    for slot, chosen, affinity in (a, b):
        assert chosen == slot_cpus(cpus, 2, slot) and affinity == chosen
    holds[0].set()
    first.join(timeout=30)
    replacement = context.Process(target=_pinned, args=(str(tmp_path), 2, cpus, holds[2], out))
    replacement.start()
    assert out.get(timeout=60)[0] == a[0]  # the slot its predecessor held
    for hold in holds:
        hold.set()
    for process in (second, replacement):
        process.join(timeout=30)


def _report_peak(out: Any) -> None:
    from fnserve.bench.sizing import peak_mb

    out.put(peak_mb())


def test_a_sized_child_reports_its_own_peak_memory_not_its_parents() -> None:
    """The Lambda sizes run in spawned children: fork, then exec. getrusage's peak outlives the exec, so a child
    of a large process would report the parent's memory as its own (and "not fit" a 512 MB size)."""
    import resource

    ballast = bytearray(400 * 1024 * 1024)  # the parent, 400 MB bigger, every page touched
    ballast[::4096] = b"x" * len(ballast[::4096])
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_report_peak, args=(out,))
    child.start()
    child_peak = out.get(timeout=120)
    child.join(60)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 > 400
    assert 5 < child_peak < 200, child_peak
    del ballast


class NoQuota:
    """A cgroup that limits nothing: what a crashed measurement does is the same under any quota."""

    def limit(self, cpus: float) -> None:
        pass

    def add(self, pid: int) -> None:
        pass


def test_a_measured_process_that_dies_is_reported_at_once(tmp_path: Path) -> None:
    """The child fails to build its handler (no such manifest) and exits without answering: the size's
    measurement says so when it exits, instead of waiting out its timeout."""
    request = made.Request(b"{}", {"Content-Type": "application/json"}, {"input": np.zeros((1, 64), np.float32)})
    with pytest.raises(RuntimeError, match="exited"):
        sizing.measure_size(
            NoQuota(),  # type: ignore[arg-type]
            tmp_path / "missing.toml",
            "digits-accurate",
            request,
            1769,
            1,
            seconds=0.2,
            price_gb_second=1.0,
            price_per_million=0.0,
        )
