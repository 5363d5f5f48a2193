"""Cascades end to end: the fast answer, the follow-up through a real queue, and the results API."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from fnserve.adapters.lambda_.sqs import create_handler as create_sqs_handler
from fnserve.aws import clients
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.settings import Settings
from fnserve.stores.dynamodb import DynamoResultStore
from tests.helpers import write_test_manifest
from tests.helpers.asgi import Get
from tests.helpers.cascade import (
    CORRECTED,
    FAST_LABEL,
    LABELS,
    SLOW_LABEL,
    SURE,
    UNSURE,
    app_client,
    follow_up,
    request,
)
from tests.helpers.clouds import Aws
from tests.servers import wait_for


@pytest.fixture
def settings(aws: Aws, tmp_path: Path) -> Settings:
    return Settings(
        manifest=write_test_manifest(tmp_path, cascade=True),
        results_table=aws.table,
        results_bucket=aws.bucket,
        followup_queue_url=aws.queue_url,
    )


def test_the_fast_answer_comes_at_once_and_the_follow_up_corrects_it(settings: Settings) -> None:
    assert len(CORRECTED) >= 3, "the demo models should disagree on some held-out digits"
    client = app_client(settings)
    get = Get(client)
    answers = [client.post("/v2/models/digits/infer", json=request([i], id=f"r{i}")) for i in CORRECTED[:3]]
    for i, response in zip(CORRECTED[:3], answers, strict=True):
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["model_name"] == "digits" and doc["id"] == f"r{i}"
        assert doc["outputs"][0]["data"] == [int(FAST_LABEL[i])]  # the fast, wrong answer
        params = doc["parameters"]
        assert params["followup_status"] == "pending" and params["answered_by"] == "digits-fast"
        assert params["followup_url"] == f"/v2/results/{params['followup_id']}"
        assert get(params["followup_url"]).json() == {
            "id": params["followup_id"],
            "status": "pending",
            "model_name": "digits-accurate",
        }
    assert follow_up(settings, 3) == {"batchItemFailures": []}
    for i, response in zip(CORRECTED[:3], answers, strict=True):
        result = get(response.json()["parameters"]["followup_url"]).json()
        assert result.get("status") == "done" and result["model_name"] == "digits-accurate", result
        outputs = {o["name"]: o for o in result["outputs"]}
        assert outputs["label"]["data"] == [int(LABELS[i])]  # the slow model corrects it
        assert outputs["probabilities"]["shape"] == [1, 10]


def test_confident_requests_skip_the_slow_model_and_send_nothing(settings: Settings) -> None:
    client = app_client(settings)
    doc = client.post("/v2/models/digits/infer", json=request(SURE[:5])).json()
    params = doc["parameters"]
    assert params["followup_status"] == "skipped"
    assert doc["outputs"][0]["data"] == FAST_LABEL[SURE[:5]].tolist()
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=settings.followup_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert Get(client)(params["followup_url"]).json()["status"] == "skipped"
    # One unsure row in the request is enough to send it to the slow model.
    mixed = client.post("/v2/models/digits/infer", json=request([*SURE[:3], UNSURE[0]])).json()
    assert mixed["parameters"]["followup_status"] == "pending"


def test_a_queue_outage_keeps_the_fast_answer(settings: Settings) -> None:
    broken = settings.replace(followup_queue_url=settings.followup_queue_url + "-gone")
    response = app_client(broken).post("/v2/models/digits/infer", json=request([UNSURE[0]]))
    assert response.status_code == 200
    doc = response.json()
    assert doc["parameters"]["followup_status"] == "unavailable"
    assert "followup_id" not in doc["parameters"]
    assert doc["outputs"][0]["data"] == [int(FAST_LABEL[UNSURE[0]])]


def test_long_poll_returns_as_soon_as_the_result_lands(settings: Settings) -> None:
    client = app_client(settings)
    url = client.post("/v2/models/digits/infer", json=request([UNSURE[0]])).json()["parameters"]["followup_url"]
    reads = [0]
    clients.client("dynamodb").meta.events.register(
        "before-parameter-build.dynamodb.BatchGetItem", lambda **_: reads.__setitem__(0, reads[0] + 1)
    )
    got: list[httpx.Response] = []
    poller = threading.Thread(target=lambda: got.append(Get(client)(url + "?wait=20")))
    poller.start()
    wait_for(lambda: reads[0] >= 2, 10, "the long poll to read the table twice")  # it is waiting now
    assert not got
    assert follow_up(settings, 1) == {"batchItemFailures": []}
    landed = reads[0]
    poller.join(timeout=60)  # a guard against a hang only: the poll's own limit is 20 s
    # Counts, not seconds: backed off to a read a second, a poll that ran to its limit would read the table
    # many more times after the result landed; one that answers on the landing reads it once or twice more.
    assert got and got[0].json()["status"] == "done"
    assert reads[0] - landed <= 2 and reads[0] < 25  # and backed off, not hammering, before


def test_unknown_forged_and_batch_ids(settings: Settings, aws: Aws) -> None:
    client = app_client(settings)
    get = Get(client)
    url = client.post("/v2/models/digits/infer", json=request([UNSURE[0]])).json()["parameters"]["followup_url"]
    forged = url[:-1] + ("0" if url[-1] != "0" else "1")
    for path in ("/v2/results/nothing-here", forged):
        response = get(path)
        assert response.status_code == 404 and "not found" in response.json()["error"]
    assert get(url + "?wait=-1").status_code == 400
    # Batch job results come through the same API.
    handler = create_sqs_handler(settings=settings)
    body = json.dumps({"id": "batch-1", "model": "digits-accurate", **request([0])})
    assert handler(sqs_event([body]), LambdaContext()) == {"batchItemFailures": []}
    result = get("/v2/results/batch-1").json()
    assert result["status"] == "done" and result["outputs"][0]["data"] == [int(SLOW_LABEL[0])]


def test_cascade_metadata_and_readiness(settings: Settings) -> None:
    get = Get(app_client(settings))
    meta = get("/v2/models/digits").json()
    assert meta["name"] == "digits" and meta["platform"] == "fnserve_cascade"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    ready = get("/v2/models/digits/ready").json()
    assert ready["name"] == "digits" and ready["ready"] is True and ready["device"] == "cpu"


def test_follow_up_failures_are_stored_as_failed_on_the_last_delivery(settings: Settings, tmp_path: Path) -> None:
    manifest = Path(settings.manifest)
    text = manifest.read_text().replace("digits-accurate/1/model.onnx", "digits-accurate-int8/1/model.onnx", 1)
    manifest.write_text(text)  # digits-accurate now fails its checksum: a 503 on every try
    handler = create_sqs_handler(settings=settings)
    body = json.dumps({"id": "f-1", "model": "digits-accurate", **request([0])})
    assert handler(sqs_event([body], [1]), LambdaContext())["batchItemFailures"]
    store = DynamoResultStore(settings.results_table or "")
    assert store.get(["job#f-1"]) == {}  # not yet: SQS will retry
    assert handler(sqs_event([body], [settings.max_receive_count]), LambdaContext())["batchItemFailures"]
    record = store.get(["job#f-1"])["job#f-1"]
    assert record.status == "failed" and "sha256" in (record.error or "")
