"""The demo cascade (digits-fast, then digits-accurate where it is unsure) on the held-out digits: which rows each
model gets right, and the cascade called in-process with its follow-up run on the real queue.

Importing this runs both demo models on the held-out digits once."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_.sqs import create_handler as create_sqs_handler
from fnserve.aws.events import LambdaContext
from fnserve.bootstrap import build_dataplane
from fnserve.settings import Settings
from fnserve.stores.dynamodb import DynamoResultStore
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.helpers.asgi import AsgiClient
from tests.helpers.clouds import Aws, received_event

HOLDOUT = np.load(DEMO_HOLDOUT)
DIGITS, LABELS = HOLDOUT["input"], HOLDOUT["labels"]
THRESHOLD = 0.65  # the demo cascade's


def run(model: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
    label, probabilities = session.run(["label", "probabilities"], {"input": x})
    return label, probabilities


FAST_LABEL, FAST_P = run("digits-fast", DIGITS)
SLOW_LABEL, _ = run("digits-accurate", DIGITS)
UNSURE = np.flatnonzero(FAST_P.max(axis=1) < THRESHOLD)
SURE = np.flatnonzero(FAST_P.max(axis=1) >= THRESHOLD)
# Held-out digits the fast model gets wrong, is unsure of, and the slow model gets right.
CORRECTED = [i for i in UNSURE if FAST_LABEL[i] != LABELS[i] and SLOW_LABEL[i] == LABELS[i]]


def request(rows: list[int] | np.ndarray, **fields: Any) -> dict[str, Any]:
    x = DIGITS[list(rows)]
    return {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        **fields,
    }


def app_client(settings: Settings) -> AsgiClient:
    store = DynamoResultStore(settings.results_table or "")
    return AsgiClient(create_app(build_dataplane(settings, store=store), settings))


def follow_up(settings: Settings, count: int) -> dict[str, Any]:
    """Run the follow-up function on the next ``count`` messages of the real queue."""
    handler = create_sqs_handler(settings=settings)
    return handler(received_event_from(settings, count), LambdaContext())


def received_event_from(settings: Settings, count: int) -> dict[str, Any]:
    aws = Aws("", settings.results_table or "", settings.results_bucket or "", settings.followup_queue_url or "", "")
    return received_event(aws, count)
