"""The demo's MiniLM (``minilm-l6``, and the ``minilm-embed`` pipeline around it) as the text benchmarks feed it: its
files and length buckets, the texts they send, and the V2 bodies of a row of tokens and of a text."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from tests.helpers import DEMO_MANIFEST, REPO

MODEL = DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx"
TOKENIZER = DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"
TOKENS = 16
# The benchmark's sentences of 8 to 45 tokens (all but a handful of very short ones and the long concatenations).
SENTENCES: list[str] = []


def length_buckets() -> list[int]:
    """The demo manifest's length buckets of minilm-l6."""
    import tomllib

    models = tomllib.loads(DEMO_MANIFEST.read_text())["models"]
    return sorted(next(m for m in models if m["name"] == "minilm-l6")["length_buckets"])


def sentences() -> list[str]:
    if not SENTENCES:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(TOKENIZER))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        for line in (REPO / "tests" / "data" / "sentences.txt").read_text().splitlines():
            if 8 <= len(tokenizer.encode(line).ids) <= 45:
                SENTENCES.append(line)
    return SENTENCES


def mix() -> list[str]:
    """Queries and passages: each sentence, and consecutive sentences joined up to a target length."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    lines = [line for line in (REPO / "tests" / "data" / "sentences.txt").read_text().splitlines() if line]
    sized = [(line, len(tokenizer.encode(line).ids)) for line in lines]
    queries = [line for line, n in sized if n <= 64]
    passages: list[str] = []
    targets, i = (48, 96, 160, 256), 0
    while len(passages) < len(queries):
        target, parts, tokens = targets[len(passages) % len(targets)], [], 0
        while tokens < target:
            line, n = sized[i % len(sized)]
            parts.append(line)
            tokens += n
            i += 1
        passages.append(" ".join(parts))
    return [text for pair in zip(queries, passages, strict=True) for text in pair]


def tensor_feed(rows: int) -> dict[str, np.ndarray[Any, Any]]:
    ids = np.random.default_rng(0).integers(1000, 30000, (1, TOKENS))
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    one = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {name: np.repeat(array, rows, axis=0) for name, array in one.items()}


def tensor_body() -> bytes:
    inputs = [
        {"name": name, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
        for name, a in tensor_feed(1).items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def text_body(text: str) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}).encode()
