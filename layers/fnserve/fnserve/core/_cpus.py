"""How many CPUs this process may really use (affinity and cgroup quota), and thread defaults."""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cpus() -> int:
    """CPUs usable by this process: its affinity mask, capped by a cgroup v2 quota if any."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = _CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def default_intra_op_threads(workers: int, cpus: int | None = None) -> int:
    """Intra-op threads per worker so that all workers together never oversubscribe the CPUs."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, workers))
