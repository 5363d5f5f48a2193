"""What a Lambda function packaged as an image must do, checked through the Runtime API on loopback.

The same checks run against the runtime interface client started from the dev environment
(``tests/functional/test_lambda_runtime.py``) and against the built image (``tests/image``): the
function polls :class:`~fnserve.emulator.runtime_api.RuntimeApi` for real-shaped events from
``events/`` and its answers are compared with onnxruntime's own on the same inputs.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fnserve.core.jobs.results import job_key
from fnserve.emulator.runtime_api import FunctionError, InitError, RuntimeApi
from fnserve.stores.dynamodb import DynamoResultStore
from tests.helpers import REPO, demo_labels
from tests.moto import aws_env

HANDLERS = {"api": "functions/api/app.handler", "batch": "functions/batch/app.handler"}
TABLE, BUCKET = "image-results", "image-payloads"


def event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((REPO / "events" / name).read_text())
    return loaded


def function_env(moto_url: str) -> dict[str, str]:
    """What template.yaml gives the functions, pointed at the moto server (the manifest is the image's own)."""
    return {
        **aws_env(moto_url),
        "FNSERVE_RESULTS_TABLE": TABLE,
        "FNSERVE_RESULTS_BUCKET": BUCKET,
        "POWERTOOLS_METRICS_NAMESPACE": "fnserve",
        "AWS_LAMBDA_FUNCTION_NAME": "fnserve-image",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "2048",
    }


def expected_labels(inputs: dict[str, Any], model: str = "digits-accurate") -> list[int]:
    """onnxruntime's labels for a V2 JSON input tensor."""
    return demo_labels(model, np.asarray(inputs["data"]).reshape(inputs["shape"]))


def check_api(api: RuntimeApi) -> None:
    """An API Gateway v2 event answers the model's own labels; an event that is none fails alone."""
    infer = event("api-http-infer.json")
    answer = api.invoke(infer, timeout=120)  # the first one waits for the cold start
    assert answer["statusCode"] == 200, answer
    body = json.loads(answer["body"])
    sent = json.loads(infer["body"])["inputs"][0]
    label = next(output for output in body["outputs"] if output["name"] == "label")
    assert body["model_name"] == "digits-accurate" and label["data"] == expected_labels(sent), body

    with pytest.raises(FunctionError) as refused:
        api.invoke({"not": "an event"})
    assert "event" in str(refused.value).lower(), refused.value.error

    metadata = api.invoke(event("api-http-metadata.json"))  # the function lives on after the bad event
    assert metadata["statusCode"] == 200 and json.loads(metadata["body"])["name"], metadata


def check_batch(api: RuntimeApi) -> None:
    """An SQS event: the good jobs' results in DynamoDB, the poison job stored as failed, nothing to redeliver."""
    jobs = event("batch-jobs.json")
    assert api.invoke(jobs, timeout=120) == {"batchItemFailures": []}
    ids = [json.loads(record["body"])["id"] for record in jobs["Records"]]
    stored = DynamoResultStore(TABLE, bucket=BUCKET).get(job_key(job_id) for job_id in ids)
    states = {record.key.removeprefix(job_key("")): record.status for record in stored.values()}
    assert states["example-0"] == "done" and states["example-poison"] == "failed", states
    assert set(states) == set(ids), states  # nothing lost

    with pytest.raises(FunctionError):
        api.invoke({"Records": "not a list"})


def check_init_error(api: RuntimeApi) -> None:
    """A function whose manifest is missing reports an init error naming it: the invocation fails, never hangs."""
    with pytest.raises(InitError) as failed:
        api.invoke(event("api-http-metadata.json"), timeout=120)
    assert "manifest" in str(failed.value).lower(), failed.value.error
