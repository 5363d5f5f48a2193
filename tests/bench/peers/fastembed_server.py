"""A peer for the text benchmark: fastembed (Qdrant's ONNX embedding library) behind FastAPI.

It serves fnserve's int8 MiniLM ONNX file, offline, from a virtualenv of its own (.venv-fastembed). At
import, the ONNX file and tokenizer.json (FASTEMBED_MODEL_PATH, FASTEMBED_TOKENIZER) are linked into a
temporary directory beside the configs fastembed's tokenizer loader reads (truncation at 256 tokens as in
sentence-transformers, padding to the longest), registered as a custom model (mean pooling, normalised)
and loaded with one onnxruntime thread (FASTEMBED_THREADS). Per request: embed the texts as one batch,
answer V2 JSON. Run: `.venv-fastembed/bin/python -m uvicorn tests.bench.peers.fastembed_server:app`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType

MODEL_NAME = "fnserve/minilm-l6-int8"  # a name of ours: fastembed knows the upstream one, from the hub
MAX_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
CONFIGS: dict[str, dict[str, Any]] = {
    "config.json": {"model_type": "bert", "max_position_embeddings": 512, "pad_token_id": 0},
    "tokenizer_config.json": {"model_max_length": MAX_LENGTH, "pad_token": "[PAD]", "do_lower_case": True},
    "special_tokens_map.json": {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    },
}


def prepare(directory: Path, onnx_path: str, tokenizer_path: str) -> None:
    """Lay `directory` out as fastembed loads a model from: the two files linked, the configs written."""
    (directory / "model.onnx").symlink_to(Path(onnx_path).resolve())
    (directory / "tokenizer.json").symlink_to(Path(tokenizer_path).resolve())
    for name, config in CONFIGS.items():
        (directory / name).write_text(json.dumps(config))


TextEmbedding.add_custom_model(
    model=MODEL_NAME,
    pooling=PoolingType.MEAN,
    normalization=True,
    sources=ModelSource(hf=MODEL_NAME),  # never fetched: specific_model_path wins
    dim=384,
    model_file="model.onnx",
)
with tempfile.TemporaryDirectory(prefix="fastembed-minilm-") as directory:  # read once, at load
    prepare(Path(directory), os.environ["FASTEMBED_MODEL_PATH"], os.environ["FASTEMBED_TOKENIZER"])
    model = TextEmbedding(
        model_name=MODEL_NAME,
        cache_dir=directory,
        threads=int(os.environ.get("FASTEMBED_THREADS", "1")),
        providers=["CPUExecutionProvider"],
        specific_model_path=directory,
        local_files_only=True,
    )
app = FastAPI()


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> dict[str, Any]:
    body = await request.json()
    texts: list[str] = body["inputs"][0]["data"]
    pooled = np.stack(list(model.embed(texts, batch_size=len(texts))))
    return {
        "model_name": name,
        "outputs": [
            {"name": "embedding", "datatype": "FP32", "shape": list(pooled.shape), "data": pooled.ravel().tolist()}
        ],
    }
