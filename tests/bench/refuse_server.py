"""The refusal floor for the overload benchmark: an ASGI app that refuses every inference at once (503 with
``Retry-After`` and ``{"error": ...}``, the body left unread, as fnserve refuses one), served as ``fnserve serve``'s
front process is (uvicorn, uvloop, fnserve's HTTP protocol), beside a thread of the same process that runs a
model's batches at the nice fnserve gives a batch's thread, busy the share of the time fnserve's model was. On the
CPU fnserve's server had, its refusals' latency is what answering at once allows on a core that also computes what
fnserve's did, with no admission, queue, decoding or answers around it.

    python -m tests.bench.refuse_server PORT [MODEL.onnx ROWS BUSY]

``BUSY``: the share of the time the model runs (1: back to back); ``GET`` on any path answers 200 once the model
has run its first batch (503 before).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np

REFUSAL = b'{"error":"the model is overloaded; try again shortly"}'
REFUSAL_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(REFUSAL)).encode()),
    (b"retry-after", b"1"),
]
UP_HEADERS = [(b"content-length", b"0")]
COMPUTING = threading.Event()  # set once the model runs (at once without one)


async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] == "GET":
        status = 200 if COMPUTING.is_set() else 503
        await send({"type": "http.response.start", "status": status, "headers": UP_HEADERS})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 503, "headers": REFUSAL_HEADERS})
    await send({"type": "http.response.body", "body": REFUSAL})


def compute(path: str, rows: int, busy: float) -> None:
    """``path``'s model on batches of ``rows`` (zeros; a token length of 16), each followed by a pause that keeps it
    running ``busy`` of the time, forever, on a thread niced as fnserve's batch threads are (one intra-op thread, as a
    one-CPU server's session has)."""
    import onnxruntime as ort

    from fnserve.core.batching.priority import _nice
    from fnserve.core.batching.scheduler import BATCH_NICE

    _nice(BATCH_NICE)  # as fnserve's batch threads are niced
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64}
    feed = {
        i.name: np.zeros([rows, *(d if isinstance(d, int) else 16 for d in i.shape[1:])], types[i.type])
        for i in session.get_inputs()
    }
    pause = (1 - busy) / busy if busy < 1 else 0.0
    while True:
        started = time.perf_counter()
        session.run(None, feed)
        COMPUTING.set()
        if pause:
            time.sleep((time.perf_counter() - started) * pause)


if __name__ == "__main__":
    import uvicorn

    if len(sys.argv) > 2:  # in this process, as a batch's thread is in fnserve's
        args = (sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        threading.Thread(target=compute, args=args, daemon=True).start()
    else:
        COMPUTING.set()
    uvicorn.run(
        refuse,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="fnserve.adapters.http.protocol:HttpProtocol",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )
