"""The floor: what raw onnxruntime does with the model on the CPUs this process may use, with no server.

For each batch size and intra-op thread count, one session runs the model back to back; and one
single-threaded session per CPU, each in its own process, at the requests' batch size. The best of
those at the requests' batch size is the capacity a server of those requests is measured against
(its ratio to the floor); the larger batches show what batching could reach at best.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class FloorPoint:
    batch: int
    threads: int
    processes: int
    rows_per_second: float
    ms: float  # one run's median wall time


@dataclass(frozen=True)
class Floor:
    points: list[FloorPoint]
    batch: int  # the requests' rows

    @property
    def capacity(self) -> float:
        """Requests per second at the requests' batch size: the best layout of raw sessions."""
        return max(p.rows_per_second for p in self.points if p.batch == self.batch) / self.batch

    def best(self) -> FloorPoint:
        """The point of the most rows per second (what batching could reach)."""
        return max(self.points, key=lambda p: p.rows_per_second)


def tile(feed: Mapping[str, np.ndarray[Any, Any]], rows: int) -> Arrays:
    """``feed`` repeated (or cut) along the batch axis to ``rows`` rows."""
    found = {}
    for name, array in feed.items():
        reps = -(-rows // array.shape[0])
        found[name] = np.concatenate([array] * reps)[:rows] if reps > 1 else array[:rows]
    return found


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def _timed(session: Any, feed: Arrays, seconds: float) -> tuple[float, float]:
    """Runs per second back to back for about ``seconds`` (after a warm-up), and one run's median ms."""
    for _ in range(3):
        session.run(None, feed)
    times: list[float] = []
    began = time.perf_counter()
    while (now := time.perf_counter()) < began + seconds or not times:
        session.run(None, feed)
        times.append(time.perf_counter() - now)
    return len(times) / (time.perf_counter() - began), float(np.median(times)) * 1e3


def _parallel(path: str, threads: int, feed: Arrays, seconds: float, start: Any, out: Any) -> None:
    session = _session(Path(path), threads)
    for _ in range(3):
        session.run(None, feed)
    out.put(("ready", 0))
    start.wait()
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        session.run(None, feed)
        done += 1
    out.put(("done", done))


def parallel_rate(path: Path, feed: Arrays, processes: int, seconds: float, threads: int = 1) -> float:
    """Runs per second of ``processes`` sessions of ``threads`` intra-op threads, one process each, together."""
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    args = (str(path), threads, feed, seconds, start, out)
    workers = [context.Process(target=_parallel, args=args) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            out.get(timeout=120)  # every one loaded and warm before the clock starts
        start.set()
        total = sum(int(out.get(timeout=seconds + 60)[1]) for _ in workers)
    finally:
        for worker in workers:
            worker.join(timeout=30)
    return total / seconds


def measure(
    path: Path,
    feed: Arrays,
    *,
    batches: list[int],
    threads: list[int],
    cpus: int,
    seconds: float = 0.5,
    progress: Callable[[str], None] | None = None,
) -> Floor:
    """The floor of the model at ``path`` for requests whose model tensors are ``feed`` (its rows are the
    requests' batch): every batch size x thread count in one session here, and one session per CPU."""
    batch = int(next(iter(feed.values())).shape[0])
    points = []
    for t in threads:
        session = _session(path, t)
        for b in sorted({batch, *batches}):
            if progress is not None:
                progress(f"raw onnxruntime: batch {b}, {t} thread(s)")
            rate, ms = _timed(session, tile(feed, b), seconds)
            points.append(FloorPoint(b, t, 1, rate * b, ms))
    if cpus > 1:
        if progress is not None:
            progress(f"raw onnxruntime: batch {batch}, {cpus} processes x 1 thread")
        rate = parallel_rate(path, feed, cpus, seconds * 2)
        points.append(FloorPoint(batch, 1, cpus, rate * batch, float("nan")))
    return Floor(points, batch)
