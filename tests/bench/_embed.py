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


def pair_tokenizer_from(path: str, max_length: int) -> Tokenizer:
    """A cross-encoder's or classifier's tokenizer as transformers' pipelines use it: cut to ``max_length`` (the
    longer of a pair's two texts first), padded to the longest."""
    tokenizer = Tokenizer.from_file(path)
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    return tokenizer


def logits(
    tokenizer: Tokenizer, session: ort.InferenceSession, texts: list[str], pairs: list[str] | None = None
) -> np.ndarray[Any, Any]:
    """Tokenize (each text with its pair, where given), run, the logits: a reranker's one a pair, a classifier's."""
    encodings = tokenizer.encode_batch(list(zip(texts, pairs, strict=True)) if pairs is not None else texts)
    made = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }
    feed = {arg.name: made[arg.name] for arg in session.get_inputs()}
    return session.run(None, feed)[0]  # type: ignore[no-any-return]
