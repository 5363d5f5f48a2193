"""The demo's models as a BentoML service, written the way BentoML's docs show: one ``@bentoml.service`` class,
an ``@bentoml.api`` method per model, served by ``bentoml serve``.

    PYTHONPATH=. bentoml serve tests.bench.peers.bento_service:DemoModels --port 3000    (from the repository root)

The same ONNX files as fnserve's demo manifest, one single-threaded onnxruntime session each in every worker, a
worker per CPU. ``digits`` takes its natural JSON (``{"input": [[64 floats]]}``) and answers ``label`` and
``probabilities``; the MiniLM methods batch adaptively (``batchable=True``, as BentoML's adaptive batching guide
does, which takes one parameter: a row of tokens is one pydantic object): ``tokens`` answers each row's token
embeddings, ``embed`` a sentence's embedding (tokenize, run, mean-pool, normalise, as the naive text server does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import bentoml
import numpy as np
import onnxruntime as ort
from bentoml.validators import DType
from pydantic import BaseModel

from tests.bench._embed import embed, tokenizer_from

MODELS = Path(__file__).resolve().parents[3] / "layers" / "models" / "models"


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # a worker per CPU: one thread each, as the naive servers run
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class Tokens(BaseModel):
    """One row of MiniLM's inputs."""

    input_ids: list[int]
    attention_mask: list[int]
    token_type_ids: list[int]


@bentoml.service(workers="cpu_count")
class DemoModels:
    def __init__(self) -> None:
        self.digits_session = session(MODELS / "digits-accurate" / "1" / "model.onnx")
        self.minilm = session(MODELS / "minilm-l6" / "1" / "model.onnx")
        self.tokenizer = tokenizer_from(str(MODELS / "minilm-l6" / "tokenizer.json"))

    @bentoml.api
    def digits(self, input: Annotated[np.ndarray, DType("float32")]) -> dict[str, Any]:
        label, probabilities = self.digits_session.run(None, {"input": input})
        return {"label": label.tolist(), "probabilities": probabilities.tolist()}

    @bentoml.api(batchable=True, max_batch_size=64, max_latency_ms=1000)
    def tokens(self, rows: list[Tokens]) -> list[np.ndarray]:
        width = max(len(row.input_ids) for row in rows)
        feed = {
            name: np.array([getattr(row, name) + [0] * (width - len(row.input_ids)) for row in rows], np.int64)
            for name in ("input_ids", "attention_mask", "token_type_ids")
        }
        tokens = self.minilm.run(None, feed)[0]
        return [tokens[i, : len(row.input_ids)] for i, row in enumerate(rows)]

    @bentoml.api(batchable=True, max_batch_size=64, max_latency_ms=1000)
    def embed(self, sentences: list[str]) -> np.ndarray:
        return embed(self.tokenizer, self.minilm, sentences)
