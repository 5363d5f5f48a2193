"""The floor of a batching server, end to end: what a server of single-threaded sessions must do to answer V2 JSON
tensors in batches, and nothing else, served as ``fnserve serve``'s front processes are (``fnserve.adapters.fronts``,
fnserve's HTTP protocol, one process per CPU pinned to it, inference in each).

Each request's whole body is read and parsed (orjson, the inputs as the model's dtypes); the requests a process
holds run as one ``session.run`` (one intra-op thread, in a thread of its own, so the event loop keeps reading) as
soon as the previous run is done and every request that was in flight at once lately is there (or 2 ms have
passed, fnserve's window), their outputs split by row and encoded (orjson's numpy serialisation) in that thread,
each answer written as it is. Left out, beside the checks of what a request holds: what fnserve adds around it
(request ids, ``Server-Timing``, metrics, statistics, logs, admission, deadlines, routing, the cache, tracing).
Unlike a floor pieced together from runs apart (raw ONNX Runtime, the echo server, the codec in a loop of its own),
the event loop's work here runs on the CPU the model's runs leave, with the caches those runs leave.

    PLAIN_MODEL_PATH=model.onnx python -m tests.bench.lean_batch_server [--processes N] --port PORT
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

WINDOW = 0.002  # seconds a batch waits at most for the requests on their way (fnserve's max_batch_time_ms)
PINS_ENV = "LEAN_BATCH_PINS"  # the directory of the CPU slot locks the front processes share
DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32}
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
Feed = dict[str, np.ndarray[Any, Any]]


class Batches:
    """One process's model and the requests waiting for its next run."""

    def __init__(self, path: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.dtypes = {i.name: DTYPES[i.type] for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.thread = concurrent.futures.ThreadPoolExecutor(1)
        self.waiting: list[tuple[Feed, asyncio.Future[bytes]]] = []
        self.running = False
        self.timer: asyncio.TimerHandle | None = None
        self.in_flight = 0
        self.most = self.last_most = 0  # the most in flight at once this second, and the last
        self.second = 0

    def feed(self, body: bytes) -> Feed:
        inputs = orjson.loads(body)["inputs"]
        return {t["name"]: np.asarray(t["data"], self.dtypes[t["name"]]).reshape(t["shape"]) for t in inputs}

    async def answer(self, body: bytes) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting.append((self.feed(body), future))
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
        if len(self.waiting) >= max(self.most, self.last_most):
            self._run()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(WINDOW, self._run)

    def _run(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.running or not self.waiting:
            return
        batch, self.waiting = self.waiting, []
        self.running = True
        done = asyncio.get_running_loop().run_in_executor(self.thread, self._compute, [feed for feed, _ in batch])
        done.add_done_callback(lambda answers: self._answered(batch, answers))

    def _compute(self, feeds: list[Feed]) -> list[bytes]:
        stacked = {name: np.concatenate([f[name] for f in feeds]) for name in self.dtypes}
        arrays = self.session.run(None, stacked)
        answers, row = [], 0
        for f in feeds:
            rows = next(iter(f.values())).shape[0]
            outputs = [
                {"name": n, "datatype": DATATYPES[a.dtype], "shape": [rows, *a.shape[1:]], "data": a[row : row + rows]}
                for n, a in zip(self.outputs, arrays, strict=True)
            ]
            answers.append(orjson.dumps({"model_name": "model", "outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY))
            row += rows
        return answers

    def _answered(self, batch: list[tuple[Feed, asyncio.Future[bytes]]], answers: asyncio.Future[list[bytes]]) -> None:
        self.running = False
        for (_, future), answer in zip(batch, answers.result(), strict=True):
            future.set_result(answer)
        self._maybe_run()


_batches: Batches | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    assert _batches is not None  # made by factory()
    parts = []
    more = True
    while more:
        message = await receive()
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    answer = await _batches.answer(b"".join(parts))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def factory() -> Any:
    """A front process's app, its model loaded and the process pinned to its CPU, as fnserve's front processes."""
    from fnserve.core._cpus import pin_process

    global _batches
    _batches = Batches(os.environ["PLAIN_MODEL_PATH"])
    pin_process(os.environ[PINS_ENV], int(os.environ["LEAN_BATCH_PROCESSES"]), sorted(os.sched_getaffinity(0)))
    return app


if __name__ == "__main__":
    import argparse

    from fnserve.adapters import fronts
    from fnserve.core._cpus import available_cpus

    parser = argparse.ArgumentParser(prog="python -m tests.bench.lean_batch_server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--processes", type=int, default=available_cpus(), help="default: one per CPU, as fnserve's")
    args = parser.parse_args()
    os.environ[PINS_ENV] = tempfile.mkdtemp(prefix="lean-batch-pins-")
    os.environ["LEAN_BATCH_PROCESSES"] = str(args.processes)
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
        shutil.rmtree(os.environ[PINS_ENV], ignore_errors=True)
