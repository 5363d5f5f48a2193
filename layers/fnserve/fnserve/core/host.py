"""The machine a process runs on: how many CPUs it may really use (affinity and cgroup quota), thread defaults, the
CPUs it is pinned to, and its heap frozen once a long-running process has built what it keeps."""

from __future__ import annotations

import contextlib
import gc
import math
import os
from collections.abc import Sequence
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


# -- CPU affinity -----------------------------------------------------------------------------------

AFFINITY_DIR_ENV = "FNSERVE_AFFINITY_DIR"
"""A directory every process of one server shares, holding one lock file per CPU slot (set by ``serve``)."""

_held: list[int] = []  # the slot lock this process holds, for its lifetime


def slot_cpus(cpus: Sequence[int], slots: int, slot: int) -> list[int]:
    """The CPUs of ``slot`` when ``cpus`` are shared by ``slots`` processes: contiguous groups of
    ``len(cpus) // slots`` (at least one; with more slots than CPUs, slots share CPUs round robin)."""
    ordered = sorted(cpus)
    size = max(1, len(ordered) // max(1, slots))
    start = (slot * size) % len(ordered)
    return ordered[start : start + size]


def pin_process(directory: str | Path, slots: int, cpus: Sequence[int]) -> tuple[int, list[int]]:
    """Claim the first free of ``slots`` CPU slots (an exclusive lock on its file in ``directory``, held
    until this process exits, so a replaced process gets its predecessor's slot) and pin every thread of
    this process to that slot's CPUs: ORT's thread pool, started already, and what starts later.

    Returns the slot and its CPUs. With every slot taken (a replacement started before the process it
    replaces is gone), the slot is picked from the process id.
    """
    import fcntl

    slot = os.getpid() % max(1, slots)
    for candidate in range(slots):
        fd = os.open(Path(directory) / f"slot-{candidate}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _held.append(fd)
        slot = candidate
        break
    chosen = slot_cpus(cpus, slots, slot)
    for task in Path("/proc/self/task").iterdir():  # this thread among them
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), chosen)
    return slot, chosen


def freeze_heap() -> None:
    """Exempt everything built so far (modules, models, the app) from garbage collection.

    It lives as long as the process; left in the collector's oldest generation, every full
    collection walks all of it again, tens of milliseconds that land on some request's
    latency (the p99 under load: docs/design/server-layout.md).
    """
    gc.collect()
    gc.freeze()
