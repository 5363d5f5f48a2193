"""The peer for the rerank and classify benchmark: the endpoints one would write by hand.

FastAPI, the tokenizer and the ONNX session in globals, and per request: tokenize every pair (or text), run them as
one batch padded to the request's longest, the sigmoid of each pair's logit (the softmax of a text's), answer JSON.
No validation, no batching across requests, no metrics.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, Request

from tests.bench._embed import logits, pair_tokenizer_from

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ.get("PLAIN_THREADS", "1"))
session = ort.InferenceSession(os.environ["PLAIN_MODEL_PATH"], sess_options=options, providers=["CPUExecutionProvider"])
tokenizer = pair_tokenizer_from(os.environ["PLAIN_TOKENIZER"], int(os.environ["PLAIN_MAX_LENGTH"]))
labels = os.environ.get("PLAIN_LABELS", "").split(",")
app = FastAPI()


@app.post("/rerank")
async def rerank(request: Request) -> dict[str, Any]:
    body = await request.json()
    documents: list[str] = body["documents"]
    scores = 1 / (1 + np.exp(-logits(tokenizer, session, [body["query"]] * len(documents), documents)[:, 0]))
    order = np.argsort(-scores, kind="stable")
    return {"results": [{"index": int(i), "relevance_score": float(scores[i])} for i in order]}


@app.post("/predict")
async def predict(request: Request) -> list[dict[str, Any]]:
    body = await request.json()
    raw = logits(tokenizer, session, [body["inputs"]])[0]
    probabilities = np.exp(raw - raw.max())
    probabilities /= probabilities.sum()
    return [{"score": float(probabilities[i]), "label": labels[i]} for i in np.argsort(-probabilities)]
