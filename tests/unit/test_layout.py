"""The server's default layout: inference in the front processes, one per CPU, as many as fit in memory."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from fnserve.core.execution.service import InferenceService
from fnserve.core.models.registry import TensorSpec
from fnserve.server.layout import IN_PROCESS_MAX_MS, choose_layout, untimed_layout
from tests.helpers import DEMO_MANIFEST, write_test_manifest

MIB = 2**20


@dataclass
class SlowSession:
    """A session that takes ``seconds`` a run (or rejects zeros when ``rejects``)."""

    seconds: float
    rejects: bool = False
    runs: list[int] = field(default_factory=list)

    def run(self, names: Any, feed: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        if self.rejects:
            raise ValueError("indices out of range")
        self.runs.append(1)
        deadline = time.perf_counter() + self.seconds
        while time.perf_counter() < deadline:  # busy, like a model: a sleep would round up
            pass
        return []


@dataclass
class RowSession:
    """A session that takes ``ms_per_row`` for each row of its feed."""

    ms_per_row: float

    def run(self, names: Any, feed: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        deadline = time.perf_counter() + self.ms_per_row * len(next(iter(feed.values()))) / 1e3
        while time.perf_counter() < deadline:
            pass
        return []


@dataclass
class Model:
    session: SlowSession | RowSession
    inputs: tuple[TensorSpec, ...] = (TensorSpec("x", "FP32", np.dtype(np.float32), (-1, 4)),)
    output_names: tuple[str, ...] = ("y",)
    settings: Any = field(
        default_factory=lambda: SimpleNamespace(length_buckets=None, max_batch_size=64, pad_inputs=())
    )
    placement: Any = field(default_factory=lambda: SimpleNamespace(device="cpu"))


class Registry:
    def __init__(self, models: dict[str, Model], batching: tuple[str, ...] = ()) -> None:
        self.models = models
        self.manifest = SimpleNamespace(
            models=[SimpleNamespace(name=n, max_batch_time_ms=2.0 if n in batching else None) for n in models]
        )

    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str) -> Model:
        return self.models[name]


class Service:
    def __init__(self, models: dict[str, Model], batching: tuple[str, ...] = ()) -> None:
        self.registry = Registry(models, batching)


def test_the_digits_models_are_served_in_process_one_front_process_per_cpu(tmp_path: Path) -> None:
    service = InferenceService.from_manifest(write_test_manifest(tmp_path), eager=True)
    layout = choose_layout(service, cpus=4, process_bytes=100 * MIB, available_bytes=8192 * MIB)
    assert (layout.processes, layout.workers) == (4, 0)
    assert set(layout.batch1_ms) == set(service.registry.names())
    assert all(ms <= IN_PROCESS_MAX_MS for ms in layout.batch1_ms.values())
    assert "well under a worker round trip" in layout.why


def test_the_demo_manifests_minilm_batches_so_its_layout_is_timed_both_ways() -> None:
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    layout = choose_layout(service, cpus=2, process_bytes=100 * MIB, available_bytes=8192 * MIB)
    assert layout.workers == 0 and "'minilm-l6' batches adaptively" in layout.why
    # Each batching model timed both ways (the reranker too), at a middle length bucket.
    found = re.findall(
        r"([\d,]+) rows/s in batches of 16 rows of 48 [^;]*? against ([\d,]+) from 2 processes", layout.why
    )
    assert found, layout.why
    rates = [tuple(int(g.replace(",", "")) for g in pair) for pair in found]
    assert layout.processes == (1 if rates[0][0] >= rates[0][1] else 2)


def test_a_heavy_batching_model_gets_one_batcher_when_whole_batches_run_faster() -> None:
    # One process's threads run 16 rows at 1 ms a row; a single-threaded process, 8 rows at 4 ms a row.
    service = Service({"bert": Model(RowSession(1.0))}, batching=("bert",))
    layout = choose_layout(
        service,  # type: ignore[arg-type]
        cpus=2,
        process_bytes=MIB,
        available_bytes=1024 * MIB,
        single_session=lambda model, threads: RowSession(4.0),
    )
    assert (layout.processes, layout.workers) == (1, 0)
    assert "'bert' batches adaptively and one batcher serves it faster (" in layout.why


def test_a_heavy_batching_model_is_split_over_the_cpus_when_that_runs_faster() -> None:
    # Threads that help little: 2.5 ms a row in one process's batches, 1 ms a row in each single-threaded one.
    service = Service({"bert": Model(RowSession(2.5)), "tiny": Model(SlowSession(0))}, batching=("bert",))
    threads = []
    layout = choose_layout(
        service,  # type: ignore[arg-type]
        cpus=2,
        process_bytes=MIB,
        available_bytes=1024 * MIB,
        single_session=lambda model, n: threads.append(n) or RowSession(1.0),
    )
    assert (layout.processes, layout.workers) == (2, 0) and threads == [1]
    assert "'bert' batches adaptively, faster split (" in layout.why
    assert "from 2 processes of 1 thread(s) batching 8 rows each" in layout.why


def test_a_heavy_model_is_timed_and_named_in_the_reason() -> None:
    light, heavy = Model(SlowSession(0)), Model(SlowSession(0.002))
    service = Service({"light": light, "heavy": heavy})
    layout = choose_layout(service, cpus=4, process_bytes=MIB, available_bytes=1024 * MIB)  # type: ignore[arg-type]
    assert (layout.processes, layout.workers) == (4, 0)
    # What it measured (at least the session's 2 ms sleep; more on a busy machine) is what the reason says.
    assert layout.batch1_ms["heavy"] >= 2.0 and f"'heavy' takes {layout.batch1_ms['heavy']:.2f} ms" in layout.why
    assert len(heavy.session.runs) > 1  # warmed, then timed


def test_a_slow_model_is_timed_within_a_budget_not_twenty_runs() -> None:
    slow = Model(SlowSession(0.05))
    layout = choose_layout(Service({"slow": slow}), cpus=2, process_bytes=MIB, available_bytes=1024 * MIB)  # type: ignore[arg-type]
    assert 2 <= len(slow.session.runs) <= 8  # one warm-up, then timed runs until ~0.25 s have passed
    assert layout.batch1_ms["slow"] >= 50


def test_a_model_that_rejects_zeros_is_served_and_said_so() -> None:
    service = Service({"odd": Model(SlowSession(0, rejects=True))})
    layout = choose_layout(service, cpus=2, process_bytes=MIB, available_bytes=1024 * MIB)  # type: ignore[arg-type]
    assert (layout.processes, layout.workers) == (2, 0)
    assert math.isinf(layout.batch1_ms["odd"]) and "cannot be timed on zeros" in layout.why


def test_explicit_threads_per_session_bound_the_front_processes() -> None:
    service = Service({"light": Model(SlowSession(0))})
    layout = choose_layout(service, cpus=8, intra_op_threads=2, process_bytes=MIB, available_bytes=1024 * MIB)  # type: ignore[arg-type]
    assert (layout.processes, layout.workers) == (4, 0)


def test_no_more_front_processes_than_fit_in_memory() -> None:
    service = Service({"big": Model(SlowSession(0))})
    # 8 CPUs, but 1 GiB a process and 4 GiB free: 80% of it holds 3.
    layout = choose_layout(service, cpus=8, process_bytes=1024 * MIB, available_bytes=4096 * MIB)  # type: ignore[arg-type]
    assert layout.processes == 3 and "3 of them as fit in 80% of the free memory (1024 MiB each)" in layout.why
    tiny = choose_layout(service, cpus=8, process_bytes=1024 * MIB, available_bytes=512 * MIB)  # type: ignore[arg-type]
    assert tiny.processes == 1


def test_a_model_that_batches_gets_one_front_process_with_every_cpu(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    manifest.write_text(
        manifest.read_text().replace('name = "digits-accurate"\n', 'name = "digits-accurate"\nmax_batch_time_ms = 2\n')
    )
    service = InferenceService.from_manifest(manifest, eager=True)
    layout = choose_layout(service, cpus=4, process_bytes=MIB, available_bytes=1024 * MIB)
    assert (layout.processes, layout.workers) == (1, 0)
    assert "'digits-accurate' batches adaptively" in layout.why


def test_a_fast_start_lays_out_one_front_process_per_cpu_without_a_model() -> None:
    layout = untimed_layout(cpus=4)
    assert (layout.processes, layout.workers, layout.batch1_ms) == (4, 0, {})
    assert "without timing the models" in layout.why
    assert (untimed_layout(cpus=8, intra_op_threads=4).processes, untimed_layout(cpus=1).processes) == (2, 1)
    assert untimed_layout(cpus=2, intra_op_threads=4).processes == 1
