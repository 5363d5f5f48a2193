"""Jobs for the batch function on the demo's digits: good ones, and poison of every kind the batch tests know, each
with the reason it is refused (the batch tests, and the drain benchmark's mix)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from fnserve.core.jobs.messages import job_message
from tests.helpers import DEMO_HOLDOUT

HOLDOUT = np.load(DEMO_HOLDOUT)
DIGITS = HOLDOUT["input"]


def job(job_id: str, rows: slice, **fields: Any) -> str:
    return json.dumps({**job_message(job_id, "digits-accurate", {"input": DIGITS[rows]}), **fields})


def digits_input(**changes: Any) -> dict[str, Any]:
    return {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist(), **changes}


BINARY_INPUT = {"name": "input", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": 256}}


def raw_job(job_id: str, **fields: Any) -> str:
    return json.dumps({"id": job_id, "model": "digits-accurate", **fields})


# A job's own fault, with an id: stored as failed with its reason, not redelivered.
POISON = {
    "unknown-model": (
        json.dumps(job_message("p-model", "nope", {"input": DIGITS[:1]})),
        "Request for unknown model: 'nope' is not found",
    ),
    "unknown-version": (job("p-version", slice(0, 1), version="9"), "'digits-accurate' version 9 is not found"),
    "wrong-shape": (
        json.dumps(job_message("p-shape", "digits-accurate", {"input": DIGITS[:1, :10]})),
        "must have 64 at axis 1",
    ),
    "wrong-dtype": (
        json.dumps(job_message("p-dtype", "digits-accurate", {"input": DIGITS[:1].astype(np.int64)})),
        "cannot be cast to it safely",
    ),
    "unknown-output": (job("p-output", slice(0, 1), outputs=[{"name": "logits"}]), "has no outputs ['logits']"),
    "missing-s3-object": (
        raw_job("p-s3", payload={"uri": "s3://fnserve-payloads/nope.json"}),
        "nope.json cannot be read: it does not exist",
    ),
    "name-is-a-list": (raw_job("p-name", inputs=[digits_input(name=["input"])]), "needs a 'name'"),
    "invalid-bucket": (raw_job("p-bucket", payload={"uri": "s3://bad_bucket!/x.json"}), "Invalid bucket name"),
    "nested-shape": (raw_job("p-nested", inputs=[digits_input(shape=[[1], 64])]), "'shape' must be a list"),
    "uint64-bools": (
        raw_job("p-bools", inputs=[digits_input(datatype="UINT64", data=[True] * 64)]),
        "UINT64 data must be numbers, got true/false",
    ),
    "fp32-overflow": (raw_job("p-inf", inputs=[digits_input(data=[1e39] * 64)]), "values out of range for FP32"),
    # Tensors in binary_data (what fnserve submit sends).
    "binary-not-base64": (raw_job("p-b64", inputs=[BINARY_INPUT], binary_data="not base64!"), "not valid base64"),
    "binary-not-a-string": (raw_job("p-b64s", inputs=[BINARY_INPUT], binary_data=256), "must be a base64 string"),
    "binary-too-short": (
        raw_job("p-short", inputs=[BINARY_INPUT], binary_data=base64.b64encode(bytes(100)).decode()),
        "claims 256 binary bytes but only 100 remain",
    ),
    "binary-too-long": (
        raw_job("p-long", inputs=[BINARY_INPUT], binary_data=base64.b64encode(bytes(260)).decode()),
        "4 bytes of binary data follow the JSON but no input claims them",
    ),
    "binary-and-payload": (
        raw_job("p-both", inputs=[BINARY_INPUT], binary_data="", payload={"uri": "s3://fnserve-payloads/x"}),
        "in 'payload' or in 'binary_data', not both",
    ),
}
# No id to store a reason under: reported, so SQS keeps the message (and moves it to the DLQ).
ANONYMOUS_POISON = {
    "not-json": "{oops",
    "not-object": "[1, 2]",
    "no-id": json.dumps({"model": "digits-accurate", "inputs": []}),
    "bad-id": json.dumps({"id": "has spaces", "model": "digits-accurate", "inputs": []}),
}
