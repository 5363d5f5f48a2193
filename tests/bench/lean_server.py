"""The lean path for the HTTP benchmarks: what a V2 request of one model needs and nothing around it, served as
``fnserve serve``'s front processes are (``fnserve.server.fronts``, fnserve's HTTP protocol: uvicorn, uvloop,
httptools, a response in one write, one process per CPU with inference in each).

Each request's whole body is read, parsed (orjson), checked against the model's inputs (names, datatype, shape,
values within FP32's range), run (``session.run``, one intra-op thread) and its outputs encoded (orjson's numpy
serialisation); a malformed one gets a 400 with ``{"error": ...}``. What fnserve adds around that is left out: the
request id, ``Server-Timing``, metrics, statistics, the log context and the data plane's layers (routing, cache,
admission, deadlines, tracing). fnserve's CPU a request over this server's is what that envelope costs on the same
transport, the same model and the same body.

    PLAIN_MODEL_PATH=model.onnx python -m tests.bench.lean_server PORT PROCESSES
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

FP32_MAX = float(np.finfo(np.float32).max)
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


class Model:
    """The model's session (one intra-op thread), its inputs' shapes and its outputs' names, read once."""

    def __init__(self, path: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.shapes = {i.name: i.shape for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def feed(self, body: bytes) -> dict[str, np.ndarray[Any, Any]]:
        """The model's feed from a V2 JSON body (FP32 inputs); ValueError saying what is wrong with it."""
        try:
            tensors = orjson.loads(body)["inputs"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ValueError("the body must be a JSON object with 'inputs'") from None
        if not isinstance(tensors, list) or len(tensors) != len(self.shapes):
            raise ValueError(f"'inputs' must be the tensors {sorted(self.shapes)}")
        feed = {}
        for t in tensors:
            name = t.get("name") if isinstance(t, dict) else None
            want = self.shapes.get(name)  # type: ignore[arg-type]
            if want is None or name in feed:
                raise ValueError(f"'inputs' must be the tensors {sorted(self.shapes)}")
            shape, data = t.get("shape"), t.get("data")
            if t.get("datatype") != "FP32" or not isinstance(shape, list) or not isinstance(data, list) or not data:
                raise ValueError(f"input {name!r} must be FP32, with 'shape' and 'data' lists")
            if len(shape) != len(want) or any(w != d for w, d in zip(want[1:], shape[1:], strict=True)):
                raise ValueError(f"input {name!r} must have shape {want}, got {shape}")
            raw = np.asarray(data)
            size = math.prod(shape) if all(type(d) is int and d > 0 for d in shape) else -1
            if raw.dtype.kind not in "if" or raw.size != size or max(data) > FP32_MAX or min(data) < -FP32_MAX:
                raise ValueError(f"input {name!r}: shape {shape} needs as many FP32 numbers")
            feed[name] = raw.astype(np.float32).reshape(shape)
        return feed

    def answer(self, name: str, body: bytes) -> tuple[int, bytes]:
        try:
            arrays = self.session.run(None, self.feed(body))
        except ValueError as exc:
            return 400, orjson.dumps({"error": str(exc)})
        outputs = [
            {"name": n, "datatype": DATATYPES[a.dtype], "shape": list(a.shape), "data": a.ravel()}
            for n, a in zip(self.outputs, arrays, strict=True)
        ]
        return 200, orjson.dumps({"model_name": name, "outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY)


_model: Model | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    assert _model is not None  # made by factory()
    parts = []
    more = True
    while more:
        message = await receive()
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    path = scope["path"].split("/")  # ["", "v2", "models", name, "infer"]
    if scope["method"] == "POST" and len(path) == 5 and path[1:3] == ["v2", "models"] and path[4] == "infer":
        status, answer = _model.answer(path[3], b"".join(parts))
    else:
        status, answer = 404, orjson.dumps({"error": "only POST /v2/models/{name}/infer is served here"})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def factory() -> Any:
    """The app of one front process, its model loaded before the first request (as fnserve's front processes do)."""
    global _model
    _model = Model(os.environ["PLAIN_MODEL_PATH"])
    return app


if __name__ == "__main__":
    from fnserve.server import fronts

    options = {
        "host": "127.0.0.1",
        "port": int(sys.argv[1]),
        "loop": "uvloop",
        "http": "fnserve.adapters.http.protocol:HttpProtocol",
        "access_log": False,
        "log_level": "warning",
    }
    fronts.run("tests.bench.lean_server:factory", int(sys.argv[2]), options)
