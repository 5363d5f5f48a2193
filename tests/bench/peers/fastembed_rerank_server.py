"""A peer for the rerank benchmark: fastembed's cross-encoder (``TextCrossEncoder``) behind FastAPI.

It serves fnserve's int8 MiniLM cross-encoder file, offline, from fastembed's own virtualenv (.venv-fastembed), laid
out as the text peer's model is (``fastembed_server.prepare``: the ONNX file and tokenizer.json linked beside the
configs fastembed's tokenizer loader reads; pairs cut to FASTEMBED_MAX_LENGTH tokens), registered as a custom
reranker and loaded with one onnxruntime thread (FASTEMBED_THREADS). Per request: rerank the documents as one batch,
answer the results best first.
Run: `.venv-fastembed/bin/python -m uvicorn tests.bench.peers.fastembed_rerank_server:app`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastembed.common.model_description import ModelSource
from fastembed.rerank.cross_encoder import TextCrossEncoder

from tests.bench.peers.fastembed_server import prepare

MODEL_NAME = "fnserve/minilm-l6-rerank-int8"  # a name of ours, never fetched
MAX_LENGTH = int(os.environ.get("FASTEMBED_MAX_LENGTH", "512"))

TextCrossEncoder.add_custom_model(model=MODEL_NAME, sources=ModelSource(hf=MODEL_NAME), model_file="model.onnx")
with tempfile.TemporaryDirectory(prefix="fastembed-rerank-") as directory:  # read once, at load
    prepare(Path(directory), os.environ["FASTEMBED_MODEL_PATH"], os.environ["FASTEMBED_TOKENIZER"])
    config = Path(directory) / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": MAX_LENGTH}))
    model = TextCrossEncoder(
        model_name=MODEL_NAME,
        cache_dir=directory,
        threads=int(os.environ.get("FASTEMBED_THREADS", "1")),
        providers=["CPUExecutionProvider"],
        specific_model_path=directory,
        local_files_only=True,
    )
app = FastAPI()


@app.post("/rerank")
async def rerank(request: Request) -> dict[str, Any]:
    body = await request.json()
    documents: list[str] = body["documents"]
    logits = np.fromiter(model.rerank(body["query"], documents, batch_size=len(documents)), np.float64)
    scores = 1 / (1 + np.exp(-logits))
    return {"results": [{"index": int(i), "relevance_score": float(scores[i])} for i in np.argsort(-scores)]}
