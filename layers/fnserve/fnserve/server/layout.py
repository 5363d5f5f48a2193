"""The server's layout, chosen at start when none is given: how many front processes, how many inference
workers each, and why (timed on the loaded models; the start log gives the figures and the reason).

Inference runs in the front processes (faster than a worker pool for light and heavy models alike:
docs/design/server-layout.md), one per CPU, as many as fit in memory, or one with every CPU's threads
when a model batches adaptively and one batcher serves it faster (timed both ways).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fnserve.core.host import AFFINITY_DIR_ENV, pin_process
from fnserve.observability.logs import logger

if TYPE_CHECKING:  # a fast start lays out its processes before onnxruntime is imported (untimed_layout)
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.models.registry import LoadedModel, Session
    from fnserve.settings import Settings

# A request's round trip to an inference worker (pipe, pickling, the worker's wake-up): a model whose batch-1
# run is a small part of it is served faster by the front processes themselves. Heavier models gave the same
# answer, since a worker's front process spends on HTTP and JSON the CPU the worker needs (bench_serve; the
# figures: docs/design/server-layout.md). So the default runs inference in the front processes:
# one per CPU (as many as fit in memory), or one when a model batches and one batcher serves it faster
# (one_batcher); a worker pool stays one flag away (--workers).
WORKER_ROUND_TRIP_MS = 0.7
IN_PROCESS_MAX_MS = WORKER_ROUND_TRIP_MS / 4
_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Layout:
    """How a server runs: front processes, inference workers in each, and why."""

    processes: int
    workers: int
    why: str
    batch1_ms: dict[str, float]


def choose_layout(
    service: InferenceService,
    cpus: int,
    intra_op_threads: int | None = None,
    process_bytes: int | None = None,
    available_bytes: int | None = None,
    single_session: Callable[[LoadedModel, int], Session] | None = None,
) -> Layout:
    """Inference in the front processes: one per CPU (per ``intra_op_threads``), as many as fit in memory; or one
    with every CPU's threads when a model batches adaptively and one batcher serves it faster (:func:`one_batcher`).

    ``process_bytes``: what one front process with every model loaded takes; ``available_bytes``:
    the memory free for them (both read from /proc when not given; no bound where unknown).
    ``single_session``: a CPU session of a model with the given threads (:func:`one_batcher`'s comparison).
    """
    times = {name: batch1_ms(service.registry.get(name)) for name in service.registry.names()}
    heaviest = max(times, key=lambda name: times[name])
    slowest = times[heaviest]
    threads = intra_op_threads or 1
    processes = max(1, cpus // threads)
    batching = sorted(m.name for m in service.registry.manifest.models if m.max_batch_time_ms is not None)
    split = ""
    if batching:
        verdicts = {
            name: one_batcher(service.registry.get(name), processes, threads, single_session)
            if processes > 1
            else (True, f"{cpus} CPU(s) at {threads} thread(s) a process: room for one process")
            for name in batching
        }
        whole = [(name, why) for name, (one, why) in verdicts.items() if one]
        if whole:
            name, why = whole[0]
            reason = (
                f"{name!r} batches adaptively and one batcher serves it faster ({why}), so one front process with "
                f"every CPU's threads ({cpus}) runs inference: one batcher, whole batches"
            )
            return Layout(1, 0, reason, times)
        split = "; ".join(f"{name!r} batches adaptively, faster split ({why})" for name, (_, why) in verdicts.items())
    process_bytes = process_bytes if process_bytes is not None else _rss_bytes()
    available_bytes = available_bytes if available_bytes is not None else _available_bytes()
    fits = ""
    if process_bytes and available_bytes is not None and processes * process_bytes > available_bytes * 0.8:
        processes = max(1, int(available_bytes * 0.8) // process_bytes)
        fits = f", {processes} of them as fit in 80% of the free memory ({process_bytes / 2**20:.0f} MiB each)"
    if split:
        why = split
    elif slowest <= IN_PROCESS_MAX_MS:
        why = (
            f"every model's batch-1 run is well under a worker round trip (~{WORKER_ROUND_TRIP_MS} ms; "
            f"the slowest, {heaviest!r}, takes {slowest:.3f} ms)"
        )
    else:
        shown = "cannot be timed on zeros" if math.isinf(slowest) else f"takes {slowest:.2f} ms at batch 1"
        why = (
            f"{heaviest!r} {shown}: heavy, and a worker's hop would still take CPU from inference "
            "(--workers N puts models in worker processes)"
        )
    return Layout(processes, 0, f"{why}; inference runs in the front processes, one per CPU ({cpus}){fits}", times)


def untimed_layout(cpus: int, intra_op_threads: int | None = None) -> Layout:
    """The layout of a fast start (``fast_start``): what :func:`choose_layout` gives most models, inference in
    the front processes, one per CPU (per ``intra_op_threads``), chosen before any model is loaded, so neither
    timed nor bounded by the memory the models take."""
    threads = intra_op_threads or 1
    processes = max(1, cpus // threads)
    why = (
        f"fast start: inference runs in the front processes, one per CPU ({cpus}) at {threads} thread(s) each, "
        "chosen without timing the models (--processes and --workers set another)"
    )
    return Layout(processes, 0, why, {})


# A batching model's whole batches are timed at this many rows (or its max_batch_size, when smaller).
BATCH_ROWS = 16


def one_batcher(
    model: LoadedModel,
    processes: int,
    threads: int = 1,
    single_session: Callable[[LoadedModel, int], Session] | None = None,
) -> tuple[bool, str]:
    """Whether a model that batches adaptively is served faster by one front process with every CPU's threads
    (one batcher, whole batches) than by ``processes`` front processes of ``threads`` threads each (each batching
    its share of the requests), and the figures that say so, on zeros at its middle length bucket.

    A tiny model is served by one batcher: HTTP costs more than the model, and one batcher fills its batches
    where split ones wait out their windows half full. A model on a GPU too. A heavy one on CPUs is timed both
    ways: ONNX Runtime may gain little from a second thread, and then split front processes, each batching its
    share on one thread, serve it faster (docs/design/server-layout.md).
    """
    settings = model.settings
    if model.placement.device != "cpu":
        return True, f"it runs on {model.placement.device}"
    buckets = settings.length_buckets or [1]
    length = buckets[len(buckets) // 2]
    rows = min(BATCH_ROWS, settings.max_batch_size)
    share = max(1, rows // processes)

    def feed(n: int) -> dict[str, Any]:
        from fnserve.core.models.registry import zeros_feed

        return zeros_feed(model.inputs, n, length, settings.pad_inputs)

    one = run_ms(model.session, model.output_names, feed(1))
    if one <= IN_PROCESS_MAX_MS or math.isinf(one):
        return True, f"{one:.3f} ms at batch 1: HTTP costs more than the model, and one batcher fills its batches"
    whole = rows / run_ms(model.session, model.output_names, feed(rows)) * 1e3
    session = (single_session or _cpu_session)(model, threads)
    split = processes * share / run_ms(session, model.output_names, feed(share)) * 1e3
    sizes = f"{rows} rows of {length}" if settings.length_buckets else f"{rows} rows"
    why = (
        f"{whole:,.0f} rows/s in batches of {sizes} on one process's threads, against {split:,.0f} from "
        f"{processes} processes of {threads} thread(s) batching {share} rows each"
    )
    return whole >= split, why


def _cpu_session(model: LoadedModel, threads: int) -> Session:
    """A CPU session of ``model``, as the registry makes it but with ``threads`` intra-op threads, for
    :func:`one_batcher`'s timing."""
    import onnxruntime as ort

    from fnserve.core.models.registry import session_options

    options = session_options(model.settings, threads)
    session: Session = ort.InferenceSession(str(model.path), sess_options=options, providers=["CPUExecutionProvider"])
    return session


def _rss_bytes() -> int | None:
    """This process's resident memory: what a front process with every model loaded will take, about."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _available_bytes() -> int | None:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def batch1_ms(model: LoadedModel) -> float:
    """Median milliseconds of a batch-1 run on zeros (inf for a model that rejects zeros)."""
    from fnserve.core.models.registry import zeros_feed

    return run_ms(model.session, model.output_names, zeros_feed(model.inputs))


def run_ms(
    session: Session, outputs: Sequence[str], feed: dict[str, Any], runs: int = 20, budget_seconds: float = 0.25
) -> float:
    """Median milliseconds of ``session`` running ``feed`` (inf when it refuses it: a model may reject zeros).

    One run to warm up, then up to ``runs`` timed ones within ``budget_seconds`` (at least one):
    a heavy model adds about a quarter of a second to the start, not twenty of its runs.
    """
    try:
        session.run(outputs, feed)
        samples: list[float] = []
        deadline = time.perf_counter() + budget_seconds
        while len(samples) < runs and (not samples or time.perf_counter() < deadline):
            t0 = time.perf_counter()
            session.run(outputs, feed)
            samples.append(time.perf_counter() - t0)
    except Exception:  # a model may reject zeros (indices, say): it is not timed
        return math.inf
    return statistics.median(samples) * 1e3


def pin_inference(settings: Settings) -> tuple[int, list[int]] | None:
    """With ``cpu_affinity``, pin this process, which runs inference, to its share of the server's CPUs
    (see :func:`fnserve.core.host.pin_process`); the slot and CPUs it got, or None when not pinned.

    The server that started this process named the directory of slot locks its processes share.
    """
    directory = os.environ.get(AFFINITY_DIR_ENV)
    if not settings.cpu_affinity or not directory:
        return None
    slots = settings.server_processes * max(1, settings.parallel_workers + settings.gpu_workers)
    slot, cpus = pin_process(directory, slots, sorted(os.sched_getaffinity(0)))
    logger.info(f"inference process {os.getpid()} pinned to CPUs {cpus} (slot {slot} of {slots})")
    return slot, cpus
