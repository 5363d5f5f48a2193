"""The peer for the HTTP benchmarks: the FastAPI app one would write by hand, served two ways.

``app`` under uvicorn is the server peer; ``handler`` (the same app under Mangum) is the
Lambda peer. It runs the same ONNX session on the same V2 JSON and answers the same V2
JSON (FP32 and INT64 tensors, whatever the model's), with no validation, no binary
extension, no logging and no metrics.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, Request
from mangum import Mangum

MODEL = os.environ["PLAIN_MODEL_PATH"]
options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("PLAIN_THREADS", "1"))
session = ort.InferenceSession(MODEL, sess_options=options, providers=["CPUExecutionProvider"])
app = FastAPI()


OUTPUTS = [o.name for o in session.get_outputs()]
DTYPES = {"FP32": np.float32, "INT64": np.int64}
DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> dict[str, Any]:
    body = await request.json()
    feed = {t["name"]: np.asarray(t["data"], dtype=DTYPES[t["datatype"]]).reshape(t["shape"]) for t in body["inputs"]}
    outputs = session.run(None, feed)
    return {
        "model_name": name,
        "outputs": [
            {"name": n, "datatype": DATATYPES[a.dtype], "shape": list(a.shape), "data": a.ravel().tolist()}
            for n, a in zip(OUTPUTS, outputs, strict=True)
        ],
    }


handler = Mangum(app, lifespan="off")
