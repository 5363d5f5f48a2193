"""Timing helpers shared by the benchmarks: interleaved samples, medians, percentiles, a process's CPU time."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fnserve.bench.sweep import process_tree


def interleaved(fns: Sequence[Callable[[], object]], rounds: int, warmup: int = 50) -> list[list[float]]:
    """Time each function once per round, alternating the order; seconds per call."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    clock = time.perf_counter
    for _ in range(rounds):
        for i in order:
            fn = fns[i]
            t0 = clock()
            fn()
            samples[i].append(clock() - t0)
        order.reverse()
    return samples


def median_us(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1e6


def shown(values: Sequence[float], fmt: str) -> str:
    """The median and, in brackets, the range: ``1.23 (1.20-1.31)``."""
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def percentile(samples: Sequence[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def fresh_process_seconds(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Wall time of a new Python process running ``code`` to completion."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) of the running process ``pid``, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) of ``pid`` and every process below it that is still running."""
    total = 0.0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):  # gone meanwhile
            total += cpu_seconds(member)
    return total
