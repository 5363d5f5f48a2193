"""Optimise an ONNX model's graph once, ahead of serving, instead of at every start.

ONNX Runtime rewrites a graph each time a session is created (constant folding, node fusions); for a transformer
that is a large part of the session's creation, which every cold start pays. Here it is done once and saved
(``SessionOptions.optimized_model_filepath``), at the extended level at most: the level above adds layouts for the
CPU it runs on, which another machine may not have. A session on the saved graph still optimises online at the
manifest's level, which then finds nearly nothing left to do; its answers are checked against the original's, and
its start and its runs timed against the original's, both in turns on the same inputs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from fnserve.core.codec.datafiles import DataFile
from fnserve.quantize import Latency, measure_latency, session

Level = Literal["basic", "extended"]
LEVELS: dict[Level, ort.GraphOptimizationLevel] = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}
# How far the optimised graph's outputs may be from the original's: a fused kernel sums in another order.
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class OptimizeReport:
    """What ``fnserve optimize`` prints: the sessions' creation before and after, runs, and the outputs compared."""

    level: str
    start_before_ms: float
    start_after_ms: float
    starts: int
    latencies: list[Latency] = field(default_factory=list)
    differences: dict[str, float] = field(default_factory=dict)  # each output's largest absolute difference
    unequal: list[str] = field(default_factory=list)  # outputs outside RTOL and ATOL

    def slower_at(self) -> list[int]:
        """Batch sizes at which the optimised graph runs confidently slower."""
        return [lat.batch for lat in self.latencies if lat.slower]

    def lines(self) -> list[str]:
        out = [
            f"level             {self.level}, saved; sessions on it optimise online at the manifest's level",
            f"session creation  {self.start_before_ms:.1f} ms -> {self.start_after_ms:.1f} ms "
            f"(median of {self.starts} each, in turns)",
        ]
        out += [lat.line() for lat in self.latencies]
        for name, diff in self.differences.items():
            verdict = "differs" if name in self.unequal else "equal"
            out.append(f"output {name}: max abs diff {diff:.3g} ({verdict} within rtol {RTOL:g}, atol {ATOL:g})")
        return out


def optimize(src: Path, dst: Path, level: Level = "extended") -> None:
    """Write ``src``'s graph, optimised by ONNX Runtime's CPU provider at ``level``, to ``dst``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), sess_options=options, providers=["CPUExecutionProvider"])


def creation_ms(before: Path, after: Path, starts: int, threads: int | None) -> tuple[float, float]:
    """Median milliseconds to create a session on each model, created in turns (the order swapped each time)."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(starts):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            began = time.perf_counter()
            session((before, after)[which], threads)
            times[which].append(time.perf_counter() - began)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def compare(before: ort.InferenceSession, after: ort.InferenceSession, data: DataFile, report: OptimizeReport) -> None:
    """Each output's largest difference between the two sessions on ``data``, and those past RTOL and ATOL."""
    answers = zip(before.run(None, data.inputs), after.run(None, data.inputs), strict=True)
    for meta, (a, b) in zip(before.get_outputs(), answers, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            equal = False
        elif a.dtype.kind in "fc":
            equal = bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))
        else:  # integers, booleans, strings (a classifier's labels): exactly
            equal = bool(np.array_equal(a, b))
        if a.shape == b.shape and a.size and a.dtype.kind in "biuf":
            report.differences[meta.name] = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        else:  # no distance between strings, or between arrays of different shapes
            report.differences[meta.name] = 0.0 if equal else math.inf
        if not equal:
            report.unequal.append(meta.name)


def optimize_and_compare(
    before: ort.InferenceSession,
    src: Path,
    dst: Path,
    level: Level,
    sample: DataFile,
    rounds: int,
    starts: int,
    threads: int | None,
    tick: Callable[[], None] | None = None,
) -> OptimizeReport:
    """Optimise ``src`` (``before``: a session on it, with ``threads``) into ``dst``, then compare the two: creation,
    runs at batch 1 and 16, and outputs."""
    optimize(src, dst, level)
    before_ms, after_ms = creation_ms(src, dst, starts, threads)
    report = OptimizeReport(level, before_ms, after_ms, starts)
    after = session(dst, threads)
    for batch in (1, 16):
        report.latencies.append(measure_latency(before, after, sample, batch, rounds, tick))
    compare(before, after, _rows_of(sample, 16), report)
    return report


def _rows_of(data: DataFile, rows: int) -> DataFile:
    inputs: dict[str, Any] = {name: value[:rows] for name, value in data.inputs.items()}
    return DataFile(inputs, None)
