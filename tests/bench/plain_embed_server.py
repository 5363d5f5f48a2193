"""The peer for the text benchmark: the sentence-embedding endpoint one would write by hand.

FastAPI, the tokenizer and the ONNX session in globals, and per request: tokenize, run, mean-pool,
normalise, answer V2 JSON. No validation, no batching across requests, no metrics.
"""

from __future__ import annotations

import os
from typing import Any

import onnxruntime as ort
from fastapi import FastAPI, Request

from tests.bench._embed import embed, tokenizer_from

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("PLAIN_THREADS", "1"))
session = ort.InferenceSession(os.environ["PLAIN_MODEL_PATH"], sess_options=options, providers=["CPUExecutionProvider"])
tokenizer = tokenizer_from(os.environ["PLAIN_TOKENIZER"])
app = FastAPI()


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> dict[str, Any]:
    body = await request.json()
    pooled = embed(tokenizer, session, body["inputs"][0]["data"])
    return {
        "model_name": name,
        "outputs": [
            {"name": "embedding", "datatype": "FP32", "shape": list(pooled.shape), "data": pooled.ravel().tolist()}
        ],
    }
