"""Triton's statistics as fnserve counts them: stages per request, executions per run, several processes added up."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fnserve.core.models import statistics as statistics_module
from fnserve.core.models.statistics import Executions, Statistics

TIMINGS = {"decode": 0.5, "pre": 0.25, "queue": 2.0, "infer": 3.0, "post": 0.125, "encode": 1.0}


def stats() -> tuple[Statistics, Executions]:
    runs = Executions()
    return Statistics([("model", "1", runs), ("pipeline", "1", None)]), runs


def stage(stat: dict, name: str) -> tuple[int, int]:
    figure = stat["inference_stats"][name]
    return figure["count"], figure["ns"]


def test_a_request_counts_in_each_of_its_stages() -> None:
    statistics, _ = stats()
    statistics.served("pipeline", "1", 9_000_000, TIMINGS, "off", rows=3)
    [stat] = statistics.report("pipeline")
    assert stage(stat, "success") == (1, 9_000_000)
    assert stage(stat, "queue") == (1, 2_000_000)
    assert stage(stat, "compute_input") == (1, 750_000)  # decode and pre steps
    assert stage(stat, "compute_infer") == (1, 3_000_000)
    assert stage(stat, "compute_output") == (1, 1_125_000)  # post steps and encode
    assert stage(stat, "cache_hit") == stage(stat, "cache_miss") == (0, 0)
    # A pipeline has no session: its successful requests are its executions.
    assert (stat["inference_count"], stat["execution_count"]) == (3, 1)
    assert stat["last_inference"] > 0


def test_a_cache_hit_is_no_inference_and_a_miss_is_counted() -> None:
    statistics, _ = stats()
    statistics.served("pipeline", "1", 1_000_000, {"decode": 0.1, "infer": 0.2, "encode": 0.1}, "hit", rows=1)
    statistics.served("pipeline", "1", 1_000_000, TIMINGS, "miss", rows=1)
    [stat] = statistics.report("pipeline", "1")
    assert stage(stat, "success")[0] == 2 and stage(stat, "queue")[0] == 2  # both, as Triton counts them
    assert stage(stat, "cache_hit") == (1, 200_000)
    assert stage(stat, "cache_miss")[0] == 1
    assert stage(stat, "compute_infer")[0] == 1  # the miss only
    assert (stat["inference_count"], stat["execution_count"]) == (1, 1)


def test_a_model_counts_its_runs_by_batch_size_whatever_thread_runs_them() -> None:
    statistics, runs = stats()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda rows: runs.ran(rows, 1000), [1, 2, 2, 8] * 250))
    statistics.served("model", "1", 10, {}, "off", rows=1)  # a request does not add a run: its run did
    [stat] = statistics.report("model")
    assert (stat["inference_count"], stat["execution_count"]) == (13 * 250, 1000)
    sizes = {b["batch_size"]: (b["compute_infer"]["count"], b["compute_infer"]["ns"]) for b in stat["batch_stats"]}
    assert sizes == {1: (250, 250_000), 2: (500, 500_000), 8: (250, 250_000)}


def test_failures_and_unknown_names() -> None:
    statistics, _ = stats()
    statistics.failed("model", "1", 5_000)
    statistics.failed("model", "9", 5_000)  # no such version: not counted anywhere
    statistics.served("nope", "1", 5_000, TIMINGS, "off", rows=1)
    assert stage(statistics.report("model")[0], "fail") == (1, 5_000)
    assert {s["name"] for s in statistics.report()} == {"model", "pipeline"}
    assert statistics.knows("model") and not statistics.knows("nope")
    assert statistics.versions("model") == ["1"]


def test_processes_add_up_what_each_shared(tmp_path: Path) -> None:
    first, first_runs = stats()
    second, second_runs = stats()
    write_first, write_second = first.share(tmp_path, "a"), second.share(tmp_path, "b")
    first.served("model", "1", 100, TIMINGS, "off", rows=2)
    first_runs.ran(2, 40)
    second.served("model", "1", 300, TIMINGS, "off", rows=4)
    second_runs.ran(4, 60)
    second_runs.ran(2, 10)
    assert first.report("model")[0]["execution_count"] == 1  # the other's figures are not written yet
    write_first(), write_second()
    for statistics in (first, second):
        [stat] = statistics.report("model")
        assert stage(stat, "success") == (2, 400)
        assert (stat["inference_count"], stat["execution_count"]) == (8, 3)
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in stat["batch_stats"]} == {2: 2, 4: 1}
        assert stat["last_inference"] > 0
    second.served("model", "1", 300, TIMINGS, "off", rows=4)
    assert stage(first.report("model")[0], "success")[0] == 2  # as of the last write
    write_second()
    assert stage(first.report("model")[0], "success")[0] == 3


def test_what_nobody_reads_is_added_up_every_so_many_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statistics_module, "PENDING", 10)
    statistics, _ = stats()
    for _ in range(25):  # a flood of refusals
        statistics.failed("model", "1", 1)
    assert len(statistics._pending) < 10  # noqa: SLF001 (the bound itself is what is tested)
    for _ in range(25):
        statistics.served("model", "1", 1, TIMINGS, "off", rows=1)
    assert len(statistics._pending) < 10  # noqa: SLF001
    [stat] = statistics.report("model")
    assert stage(stat, "success") == (25, 25) and stage(stat, "fail") == (25, 25)
