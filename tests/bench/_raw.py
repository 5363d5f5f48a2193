"""Raw onnxruntime, the floor the text benchmarks hold servers to: single-threaded sessions, one a spawned process,
started side by side once all are ready."""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tests.bench._minilm import MODEL, TOKENIZER, length_buckets, sentences, tensor_feed

RAW_SECONDS = float(os.environ.get("BENCH_BATCHING_RAW_SECONDS", "4"))


def _raw(kind: str, batch: int, seconds: float, start: Any, out: Any) -> None:
    import onnxruntime as ort

    from tests.bench._embed import embed, tokenizer_from

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), sess_options=options, providers=["CPUExecutionProvider"])
    work: list[Callable[[], object]]
    if kind == "tensor":
        feed = tensor_feed(batch)
        work = [lambda: session.run(None, feed)]
    elif kind == "text":
        tokenizer = tokenizer_from(str(TOKENIZER))
        texts = sentences()
        if batch > 1:  # like lengths together, as length buckets group them
            texts = sorted(texts, key=lambda t: len(tokenizer.encode(t).ids))
        groups = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
        work = [functools.partial(embed, tokenizer, session, group) for group in groups]
    else:  # "flight": ``batch`` sentences drawn at random, run in groups of the model's length buckets
        tokenizer = tokenizer_from(str(TOKENIZER))
        texts, buckets = sentences(), length_buckets()
        rng = np.random.default_rng(os.getpid())
        work = []
        for _ in range(200):
            drawn: dict[int, list[str]] = {}
            for i in rng.integers(0, len(texts), batch):
                length = len(tokenizer.encode(texts[i]).ids)
                drawn.setdefault(next((b for b in buckets if b >= length), length), []).append(texts[i])
            embeds = [functools.partial(embed, tokenizer, session, group) for group in drawn.values()]
            work.append(functools.partial(_each, embeds))
    for task in work[:3]:
        task()
    out.put(("ready", 0, 0.0))
    start.wait()
    done, began = 0, time.process_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work[done % len(work)]()
        done += 1
    out.put(("done", done * batch, time.process_time() - began))


def _each(tasks: Sequence[Callable[[], object]]) -> None:
    for task in tasks:
        task()


def raw(kind: str, batch: int, processes: int) -> tuple[float, float]:
    """Rows per second of ``processes`` single-threaded sessions together, and the CPU milliseconds per row."""
    rows, cpu = side_by_side(functools.partial(_raw, kind, batch), processes, RAW_SECONDS)
    return rows / RAW_SECONDS, cpu / rows * 1e3


def side_by_side(work: Callable[..., None], processes: int, seconds: float) -> tuple[int, float]:
    """``work(seconds, start, out)`` in ``processes`` spawned processes at once, each started once all are ready:
    the rows they ran and the CPU seconds they used, summed."""
    results = each_side_by_side(work, processes, seconds)
    return sum(r[1] for r in results), sum(r[2] for r in results)


def each_side_by_side(work: Callable[..., None], processes: int, seconds: float) -> list[tuple[str, Any, Any]]:
    """What each of ``processes`` spawned processes running ``work(seconds, start, out)`` at once put last on
    ``out``, each started once all are ready."""
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    workers = [context.Process(target=work, args=(seconds, start, out)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            out.get(timeout=300)
        start.set()
        results = [out.get(timeout=seconds + 120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
    return results
