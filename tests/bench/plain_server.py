"""The peer for the HTTP benchmarks: the FastAPI app one would write by hand, served two ways.

``app`` under uvicorn is the server peer; ``handler`` (the same app under Mangum) is the
Lambda peer. It runs the same ONNX session on the same V2 JSON and answers the same V2
JSON, with no validation, no binary extension, no logging and no metrics.
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


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> dict[str, Any]:
    body = await request.json()
    tensor = body["inputs"][0]
    x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    label, probabilities = session.run(None, {tensor["name"]: x})
    return {
        "model_name": name,
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": list(label.shape), "data": label.tolist()},
            {
                "name": "probabilities",
                "datatype": "FP32",
                "shape": list(probabilities.shape),
                "data": probabilities.ravel().tolist(),
            },
        ],
    }


handler = Mangum(app, lifespan="off")
