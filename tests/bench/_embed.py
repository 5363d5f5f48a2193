"""Sentence embeddings the way one writes them by hand (tokenizers + onnxruntime + numpy): the
text benchmark's peer server and its floor both run this."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


def tokenizer_from(path: str) -> Tokenizer:
    """The tokenizer as sentence-transformers uses it: truncated to 256 tokens, padded to the longest."""
    tokenizer = Tokenizer.from_file(path)
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()
    return tokenizer


def embed(tokenizer: Tokenizer, session: ort.InferenceSession, texts: list[str]) -> np.ndarray[Any, Any]:
    """Tokenize, run, mean-pool over the attention mask, normalise."""
    encodings = tokenizer.encode_batch(texts)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    feed = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }
    tokens = session.run(None, feed)[0]
    weights = mask[..., None].astype(np.float32)
    pooled = (tokens * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)  # type: ignore[no-any-return]
