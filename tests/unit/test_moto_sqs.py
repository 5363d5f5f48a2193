"""The emulator's moto SQS speed-ups change what SQS costs, not what it does: the same script, before and after."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

moto = pytest.importorskip("moto")


def scenario() -> list[Any]:
    """Sends, receives, deletes (valid, repeated, stale and invalid handles), counts, redrive: a transcript."""
    sqs = boto3.client("sqs", region_name="us-east-1")
    dlq = sqs.create_queue(QueueName="dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
    queue = sqs.create_queue(QueueName="jobs", Attributes={"RedrivePolicy": redrive})["QueueUrl"]
    log: list[Any] = []
    for start in range(0, 30, 10):
        entries = [{"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(10)]
        sqs.send_message_batch(QueueUrl=queue, Entries=entries)

    def counts(url: str) -> list[str]:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return [attributes[name] for name in names]

    def receive(visibility: int, count: int = 10) -> list[dict[str, Any]]:
        messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=count, VisibilityTimeout=visibility)
        return messages.get("Messages", [])

    log.append(counts(queue))
    first = receive(30)
    log.append([m["Body"] for m in first])
    log.append(counts(queue))
    entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(first[:5])]
    entries += [{"Id": "bogus", "ReceiptHandle": "not-a-handle"}]
    deleted = sqs.delete_message_batch(QueueUrl=queue, Entries=entries)
    log.append(sorted(e["Id"] for e in deleted["Successful"]))
    log.append([(e["Id"], e["Code"]) for e in deleted.get("Failed", [])])
    again = sqs.delete_message_batch(
        QueueUrl=queue, Entries=[{"Id": "again", "ReceiptHandle": first[0]["ReceiptHandle"]}]
    )
    log.append([e["Id"] for e in again["Successful"]])
    log.append(counts(queue))
    second = receive(0)  # visible again at once: their earlier handles are stale but still delete
    stale = second[0]["ReceiptHandle"]
    third = receive(0)
    log.append([m["Body"] for m in second] + [m["Body"] for m in third])
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=stale)
    for _ in range(3):  # past maxReceiveCount: moved to the DLQ on the next receive
        receive(0)
    log.append(sorted(m["Body"] for m in receive(0)))
    log.append(counts(dlq))
    log.append(sorted(m["Body"] for m in sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10).get("Messages", [])))
    return log


def test_the_speed_ups_keep_moto_sqs_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    from fnserve.emulator import moto_sqs

    for name, value in {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        plain = scenario()
    assert moto_sqs.apply()
    with moto.mock_aws():
        patched = scenario()
    assert patched == plain
    assert plain[0] == ["30", "0"] and plain[2] == ["20", "10"]
    assert plain[4] == [("bogus", "ReceiptHandleIsInvalid")]
