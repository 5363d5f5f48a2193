"""The floor of a batching server, end to end: what a server of single-threaded sessions must do to answer V2 JSON
in batches, and nothing else, served as ``fnserve serve``'s front processes are (``fnserve.server.fronts``,
fnserve's HTTP protocol, one process per CPU pinned to it, inference in each).

Each request's whole body is read and parsed; the requests a process holds run together (one intra-op thread, in a
thread of its own at the nice fnserve gives its batch threads, so the event loop keeps reading) as soon as the
previous run is done and every request that was in flight at once lately is there (or 2 ms have passed, fnserve's
window); each request's answer is encoded in that thread (orjson's numpy serialisation) and written as it is.
Tensors (fnserve's reader of V2 JSON) run as one ``session.run``. Texts (``--tokenizer``, the input ``text``), as
``minilm-embed`` and the naive text server compute them: one ``encode_batch`` of the batch's texts, grouped by the
model's length buckets (``--buckets``), each group padded to its longest and run, mean-pooled, normalised. Left
out, beside the checks of what a request holds: what fnserve adds around it (request ids, ``Server-Timing``,
metrics, statistics, logs, deadlines, routing, the cache, tracing). Unlike a floor pieced together from runs apart
(raw ONNX Runtime, the echo server, the codec in a loop of its own), the event loop's work here runs on the CPU
the model's runs leave, with the caches those runs leave.

With ``--max-batch ROWS`` a run takes at most that many rows; with ``--queue ROWS`` too, a request that finds a batch
running and that many rows waiting (those still being read counted at the rows a request brought last) is refused at
once, from its headers, its body unread: 503 with ``Retry-After``, sent at once, as fnserve refuses one. ``GET`` on
any path answers 200 (the model loads first).

    PLAIN_MODEL_PATH=model.onnx python -m tests.bench.lean_batch_server [--processes N] [--max-batch ROWS]
        [--queue ROWS] [--tokenizer tokenizer.json --buckets 12,16,...] --port PORT
"""

from __future__ import annotations

import asyncio
import bisect
import os
import shutil
import tempfile
import time
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort
import orjson

from fnserve.adapters.http.infer import read_body
from fnserve.adapters.http.wire import answered
from fnserve.core.batching.priority import run_niced
from fnserve.core.batching.scheduler import BATCH_NICE
from fnserve.core.codec.tensors import decode_request
from tests.bench.refuse_server import REFUSAL, REFUSAL_HEADERS, UP_HEADERS

WINDOW = 0.002  # seconds a batch waits at most for the requests on their way (fnserve's max_batch_time_ms)
SETTINGS_ENV = "LEAN_BATCH_SETTINGS"  # how the front processes (spawned afresh) learn the command line's settings
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
NUMPY = orjson.OPT_SERIALIZE_NUMPY
BODY_LIMIT = 64 * 1024 * 1024  # bytes a request may bring (fnserve's reader refuses past its limit)


class Work(Protocol):
    """What one kind of request needs: its body read (the request, and its rows), and a batch of them computed."""

    def read(self, body: bytes) -> tuple[Any, int]: ...

    def compute(self, requests: list[Any]) -> list[bytes]: ...


class Tensors:
    """V2 tensors in, the model's outputs out."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.inputs = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]

    def read(self, body: bytes) -> tuple[dict[str, np.ndarray[Any, Any]], int]:
        inputs = decode_request(body).inputs  # simdjson's numbers straight into arrays, as fnserve reads them
        return inputs, next(iter(inputs.values())).shape[0]

    def compute(self, requests: list[dict[str, np.ndarray[Any, Any]]]) -> list[bytes]:
        stacked = {name: np.concatenate([r[name] for r in requests]) for name in self.inputs}
        arrays = self.session.run(None, stacked)
        answers, row = [], 0
        for r in requests:
            rows = next(iter(r.values())).shape[0]
            outputs = [
                {"name": n, "datatype": DATATYPES[a.dtype], "shape": [rows, *a.shape[1:]], "data": a[row : row + rows]}
                for n, a in zip(self.outputs, arrays, strict=True)
            ]
            answers.append(orjson.dumps({"model_name": "model", "outputs": outputs}, option=NUMPY))
            row += rows
        return answers


class Texts:
    """Texts in (the input ``text``), their sentence embeddings out."""

    def __init__(self, session: ort.InferenceSession, tokenizer: str, buckets: list[int]) -> None:
        from tokenizers import Tokenizer

        self.session = session
        self.tokenizer = Tokenizer.from_file(tokenizer)
        self.tokenizer.enable_truncation(256)  # as sentence-transformers
        self.tokenizer.no_padding()  # each group is padded to its longest below (the file pads every text to 128)
        self.buckets = sorted(buckets)

    def read(self, body: bytes) -> tuple[list[str], int]:
        texts = orjson.loads(body)["inputs"][0]["data"]
        return texts, len(texts)

    def compute(self, requests: list[list[str]]) -> list[bytes]:
        encodings = self.tokenizer.encode_batch([text for texts in requests for text in texts])
        groups: dict[int, list[int]] = {}
        for i, encoding in enumerate(encodings):
            at = bisect.bisect_left(self.buckets, len(encoding.ids))
            groups.setdefault(self.buckets[at] if at < len(self.buckets) else len(encoding.ids), []).append(i)
        pooled: np.ndarray[Any, Any] | None = None
        for rows in groups.values():
            longest = max(len(encodings[i].ids) for i in rows)
            ids, types, mask = (np.zeros((len(rows), longest), np.int64) for _ in range(3))
            for row, i in enumerate(rows):
                length = len(encodings[i].ids)
                ids[row, :length], types[row, :length], mask[row, :length] = encodings[i].ids, encodings[i].type_ids, 1
            tokens = self.session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
            weights = mask[..., None].astype(np.float32)
            group = (tokens * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            if pooled is None:
                pooled = np.empty((len(encodings), group.shape[1]), np.float32)
            pooled[rows] = group / np.linalg.norm(group, axis=1, keepdims=True)
        assert pooled is not None
        answers, row = [], 0
        for texts in requests:
            part = pooled[row : row + len(texts)]
            output = {"name": "embedding", "datatype": "FP32", "shape": list(part.shape), "data": part}
            answers.append(orjson.dumps({"model_name": "model", "outputs": [output]}, option=NUMPY))
            row += len(texts)
        return answers


Waiting = tuple[Any, int, asyncio.Future[bytes]]  # a request as read, its rows, and its answer to come


class Batches:
    """One process's work and the requests waiting for its next run."""

    def __init__(self, work: Work, max_batch: int | None, queue: int | None) -> None:
        self.work = work
        self.max_batch = max_batch
        self.queue = queue
        self.waiting: list[Waiting] = []
        self.waiting_rows = 0
        self.reading = 0  # requests let in whose bodies are being read
        self.rows_seen = 1  # the rows the last request brought
        self.running = False
        self.timer: asyncio.TimerHandle | None = None
        self.in_flight = 0
        self.most = self.last_most = 0  # the most in flight at once this second, and the last
        self.second = 0

    def admits(self) -> bool:
        """Whether a request may come in: no queue bound, no batch running, or room in the queue."""
        if self.queue is None or not self.running:
            return True
        return self.waiting_rows + self.reading * self.rows_seen < self.queue

    async def answer(self, body: bytes) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        request, rows = self.work.read(body)
        self.rows_seen = rows
        self.waiting.append((request, rows, future))
        self.waiting_rows += rows
        self.in_flight += 1
        now = int(time.monotonic())
        if now != self.second:
            self.second, self.last_most, self.most = now, self.most, 0
        self.most = max(self.most, self.in_flight)
        self._maybe_run()
        try:
            return await future
        finally:
            self.in_flight -= 1

    def _maybe_run(self) -> None:
        if self.running or not self.waiting:
            return
        full = self.max_batch is not None and self.waiting_rows >= self.max_batch
        if full or len(self.waiting) >= max(self.most, self.last_most):
            self._run()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(WINDOW, self._run)

    def _run(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.running or not self.waiting:
            return
        taken, rows = 0, 0
        for _, own, _ in self.waiting:
            if taken and self.max_batch is not None and rows + own > self.max_batch:
                break
            taken, rows = taken + 1, rows + own
        batch, self.waiting = self.waiting[:taken], self.waiting[taken:]
        self.waiting_rows -= rows
        self.running = True
        requests = [request for request, _, _ in batch]
        # On fnserve's own threads for batches, niced below the event loop as its batches are.
        done = asyncio.ensure_future(run_niced(BATCH_NICE, self.work.compute, requests))
        done.add_done_callback(lambda answers: self._answered(batch, answers))

    def _answered(self, batch: list[Waiting], answers: asyncio.Future[list[bytes]]) -> None:
        self.running = False
        for (_, _, future), answer in zip(batch, answers.result(), strict=True):
            future.set_result(answer)
        self._maybe_run()


_batches: Batches | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    assert _batches is not None  # made by factory()
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": UP_HEADERS})
        await send({"type": "http.response.body", "body": b""})
        return
    if not _batches.admits():
        await send({"type": "http.response.start", "status": 503, "headers": REFUSAL_HEADERS})
        await send({"type": "http.response.body", "body": REFUSAL})
        answered(scope, 503)
        return
    _batches.reading += 1
    try:
        body = await read_body(receive, None, BODY_LIMIT)  # fnserve's own reader
    finally:
        _batches.reading -= 1
    answer = await _batches.answer(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def factory() -> Any:
    """A front process's app, its model loaded and the process pinned to its CPU, as fnserve's front processes."""
    from fnserve.core.host import pin_process

    global _batches
    settings = orjson.loads(os.environ[SETTINGS_ENV])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(os.environ["PLAIN_MODEL_PATH"], options, providers=["CPUExecutionProvider"])
    work: Work = Tensors(session)
    if settings["tokenizer"] is not None:
        work = Texts(session, settings["tokenizer"], settings["buckets"])
    _batches = Batches(work, settings["max_batch"], settings["queue"])
    pin_process(settings["pins"], settings["processes"], sorted(os.sched_getaffinity(0)))
    return app


if __name__ == "__main__":
    import argparse

    from fnserve.core.host import available_cpus
    from fnserve.server import fronts

    parser = argparse.ArgumentParser(prog="python -m tests.bench.lean_batch_server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=available_cpus(), help="default: one per CPU, as fnserve's")
    parser.add_argument("--max-batch", type=int, help="the most rows a run takes (default: all that wait)")
    parser.add_argument("--queue", type=int, help="the rows that may wait behind a running batch (default: any)")
    parser.add_argument("--tokenizer", help="texts in, embeddings out: the tokenizer.json")
    parser.add_argument("--buckets", default="", help="the texts' length buckets, comma-separated")
    args = parser.parse_args()
    pins = tempfile.mkdtemp(prefix="lean-batch-pins-")  # the CPU slot locks the front processes share
    settings = {
        "processes": args.processes,
        "max_batch": args.max_batch,
        "queue": args.queue,
        "tokenizer": args.tokenizer,
        "buckets": [int(b) for b in args.buckets.split(",") if b],
        "pins": pins,
    }
    os.environ[SETTINGS_ENV] = orjson.dumps(settings).decode()
    options = {
        "host": "127.0.0.1",
        "port": args.port,
        "loop": "uvloop",
        "http": "fnserve.adapters.http.protocol:HttpProtocol",
        "access_log": False,
        "log_level": "warning",
    }
    try:
        fronts.run("tests.bench.lean_batch_server:factory", args.processes, options)
    finally:
        shutil.rmtree(pins, ignore_errors=True)
