"""``fnserve local -p ImageUri=IMAGE``: template.yaml's image functions started from the built Lambda image,
each container polling a Runtime API of the emulator's, behind the same gateway and SQS pollers as zip ones."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from fnserve.aws import clients
from fnserve.core.jobs.results import job_key
from fnserve.emulator.emulator import Emulator, Local
from fnserve.stores.dynamodb import DynamoResultStore
from tests.helpers import REPO
from tests.image.buildah import Built
from tests.lambda_runtime import event, expected_labels
from tests.moto import free_port
from tests.servers import wait_for


@pytest.fixture
def emulator(lambda_image: Built, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Emulator, Local]]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # its own embedded moto server
    monkeypatch.delenv("LOCALSTACK_HOST", raising=False)
    emulator = Emulator(
        REPO / "template.yaml", port=free_port(), parameters={"ImageUri": lambda_image.name, "ApiAuth": "NONE"}
    )
    try:
        yield emulator, emulator.start()
    finally:
        emulator.stop()
        clients.reset()


def test_the_templates_image_functions_serve_http_and_sqs_from_the_image(emulator: tuple[Emulator, Local]) -> None:
    running, local = emulator
    assert set(running.pools) == {"ApiImageFunction", "BatchImageFunction", "FollowupImageFunction"}

    infer = event("api-http-infer.json")
    sent = json.loads(infer["body"])
    answer = httpx.post(f"http://127.0.0.1:{running.port}{infer['rawPath']}", json=sent, timeout=120)
    assert answer.status_code == 200, answer.text
    label = next(output for output in answer.json()["outputs"] if output["name"] == "label")
    assert label["data"] == expected_labels(sent["inputs"][0])

    bad = httpx.post(f"http://127.0.0.1:{running.port}/v2/models/digits-accurate/infer", content=b"{", timeout=30)
    assert bad.status_code == 400 and "error" in bad.json()

    job = json.loads(event("batch-jobs.json")["Records"][0]["body"])
    clients.client("sqs").send_message(QueueUrl=local.queues["JobsQueue"], MessageBody=json.dumps(job))
    store = DynamoResultStore(local.tables["ResultsTable"])
    wait_for(lambda: bool(store.get([job_key(job["id"])])), 120, "the image's batch function to store the job")
    assert store.get([job_key(job["id"])])[job_key(job["id"])].status == "done"
