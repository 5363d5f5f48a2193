"""The server's default layout: in-process front processes for light models, a worker for heavy ones."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fnserve.adapters.server import IN_PROCESS_MAX_MS, choose_layout
from fnserve.core.registry import TensorSpec
from fnserve.core.service import InferenceService
from tests.helpers import DEMO_MANIFEST


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
class Model:
    session: SlowSession
    inputs: tuple[TensorSpec, ...] = (TensorSpec("x", "FP32", np.dtype(np.float32), (-1, 4)),)
    output_names: tuple[str, ...] = ("y",)


class Registry:
    def __init__(self, models: dict[str, Model]) -> None:
        self.models = models

    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str) -> Model:
        return self.models[name]


class Service:
    def __init__(self, models: dict[str, Model]) -> None:
        self.registry = Registry(models)


def test_the_demo_models_are_served_in_process_one_front_process_per_cpu() -> None:
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    layout = choose_layout(service, cpus=4)
    assert (layout.processes, layout.workers) == (4, 0)
    assert set(layout.batch1_ms) == set(service.registry.names())
    assert all(ms <= IN_PROCESS_MAX_MS for ms in layout.batch1_ms.values())
    assert "well under a worker round trip" in layout.why


def test_one_heavy_model_takes_the_whole_server_to_a_worker() -> None:
    light, heavy = Model(SlowSession(0)), Model(SlowSession(0.002))
    layout = choose_layout(Service({"light": light, "heavy": heavy}), cpus=4)  # type: ignore[arg-type]
    assert (layout.processes, layout.workers) == (1, 1)
    assert "'heavy' takes 2." in layout.why and layout.batch1_ms["heavy"] >= 2.0
    assert len(heavy.session.runs) > 1  # warmed, then timed


def test_a_model_that_rejects_zeros_is_not_taken_as_light() -> None:
    layout = choose_layout(Service({"odd": Model(SlowSession(0, rejects=True))}), cpus=2)  # type: ignore[arg-type]
    assert (layout.processes, layout.workers) == (1, 1)
    assert math.isinf(layout.batch1_ms["odd"]) and "cannot run on zeros" in layout.why


def test_explicit_threads_per_session_bound_the_front_processes() -> None:
    layout = choose_layout(Service({"light": Model(SlowSession(0))}), cpus=8, intra_op_threads=2)  # type: ignore[arg-type]
    assert (layout.processes, layout.workers) == (4, 0)
