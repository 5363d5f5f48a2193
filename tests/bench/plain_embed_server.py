"""The peer for the text benchmark: the sentence-embedding endpoint one would write by hand.

FastAPI, the tokenizer and the ONNX session in globals, and per request: tokenize, run, mean-pool,
normalise, answer V2 JSON. No validation, no batching across requests, no metrics.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, Request
from tokenizers import Tokenizer

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("PLAIN_THREADS", "1"))
session = ort.InferenceSession(os.environ["PLAIN_MODEL_PATH"], sess_options=options, providers=["CPUExecutionProvider"])
tokenizer = Tokenizer.from_file(os.environ["PLAIN_TOKENIZER"])
tokenizer.enable_truncation(256)
tokenizer.enable_padding()
app = FastAPI()


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> dict[str, Any]:
    body = await request.json()
    encodings = tokenizer.encode_batch(body["inputs"][0]["data"])
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    feed = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }
    tokens = session.run(None, feed)[0]
    weights = mask[..., None].astype(np.float32)
    pooled = (tokens * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    return {
        "model_name": name,
        "outputs": [
            {"name": "embedding", "datatype": "FP32", "shape": list(pooled.shape), "data": pooled.ravel().tolist()}
        ],
    }
