"""SQS events of digits-accurate jobs, and what a batch handler of them is held to: a hand-written vectorised
handler, and the floors of reading their numbers (the SQS benchmark's pieces, which bench_peers runs too)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import orjson
import simdjson

from fnserve.core.jobs.messages import CHUNK, job_message
from tests.helpers import DEMO_HOLDOUT

RECORDS = int(os.environ.get("BENCH_SQS_RECORDS", "10000"))
REPEATS = int(os.environ.get("BENCH_SQS_REPEATS", "5"))
DIGITS = np.load(DEMO_HOLDOUT)["input"]


def bodies(n: int, prefix: str, unique: bool = False, binary: bool = False) -> list[str]:
    """Jobs of one held-out digit each; ``unique`` nudges each input so no two share a cache key."""
    rows = [DIGITS[i % len(DIGITS)][None] + (i * 1e-3 if unique else 0) for i in range(n)]
    return [
        json.dumps(job_message(f"{prefix}-{i}", "digits-accurate", {"input": row}, binary=binary))
        for i, row in enumerate(rows)
    ]


def naive_vectorised(session: Any, names: list[str], event: dict[str, Any], store: dict[str, Any]) -> None:
    """What a hand-written vectorised handler does: every body parsed, one ``session.run`` on the stacked rows, each
    record's outputs kept as plain lists (no validation, no partial failures, no cache, no result records)."""
    docs = [orjson.loads(record["body"]) for record in event["Records"]]
    outputs = session.run(names, {"input": np.asarray([d["inputs"][0]["data"] for d in docs], np.float32)})
    columns = [o.tolist() for o in outputs]
    for i, doc in enumerate(docs):
        store[doc["id"]] = {name: column[i] for name, column in zip(names, columns, strict=True)}


def parse_floor(texts: list[str]) -> np.ndarray[Any, Any]:
    """Every body parsed by orjson and its numbers stacked in one array, and nothing else: in chunks, the fastest
    way (a chunk's objects are freed before the next one's are made, so memory is reused while in cache)."""
    parts = []
    for start in range(0, len(texts), CHUNK):
        docs = [orjson.loads(text) for text in texts[start : start + CHUNK]]
        parts.append(np.asarray([doc["inputs"][0]["data"] for doc in docs], dtype=np.float32))
    return np.concatenate(parts)


def simdjson_floor(texts: list[str]) -> np.ndarray[Any, Any]:
    """Every body's numbers read by simdjson into a buffer and stacked in one array, and nothing else (no field
    read, no check): in chunks, as fnserve reads them."""
    parser, parts = simdjson.Parser(), []
    for start in range(0, len(texts), CHUNK):
        buffers = [
            parser.parse(text)["inputs"][0]["data"].as_buffer(of_type="d") for text in texts[start : start + CHUNK]
        ]
        parts.append(np.frombuffer(b"".join(buffers), np.float64).astype(np.float32))
    return np.concatenate(parts)
