"""The cloud services the functional tests run against, emulated: AWS's resources in a moto server (a table, a
bucket, a queue with its DLQ), and a Cloud Storage bucket in gcp-storage-emulator. The fixtures that start them stay
in tests/functional/conftest.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fnserve.aws import clients as aws_clients
from fnserve.aws.events import sqs_event


@dataclass
class Aws:
    """The AWS resources of one test, in a freshly reset moto server."""

    url: str
    table: str
    bucket: str
    queue_url: str
    dlq_url: str


def create_resources(table: str, bucket: str, queue: str) -> tuple[str, str]:
    """The results table (TTL on), the bucket, and a queue with its DLQ; returns (queue URL, DLQ URL)."""
    dynamodb = aws_clients.client("dynamodb")
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )
    aws_clients.client("s3").create_bucket(Bucket=bucket)
    sqs = aws_clients.client("sqs")
    dlq_url = sqs.create_queue(QueueName=f"{queue}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"})
    queue_url = sqs.create_queue(QueueName=queue, Attributes={"RedrivePolicy": redrive, "VisibilityTimeout": "30"})[
        "QueueUrl"
    ]
    return queue_url, dlq_url


def received_event(aws: Aws, count: int) -> dict[str, Any]:
    """Receive ``count`` messages from the real queue and wrap them as Lambda's SQS event."""
    sqs = aws_clients.client("sqs")
    messages: list[dict[str, Any]] = []
    for _ in range(50):  # bounded: each receive long-polls up to 1 s
        response = sqs.receive_message(
            QueueUrl=aws.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages += response.get("Messages", [])
        if len(messages) >= count:
            break
    assert len(messages) == count
    event = sqs_event([m["Body"] for m in messages])
    for record, message in zip(event["Records"], messages, strict=True):
        record["messageId"] = message["MessageId"]
        record["receiptHandle"] = message["ReceiptHandle"]
        record["attributes"] |= message["Attributes"]
        record["messageAttributes"] = {  # as Lambda hands them over
            name: {"stringValue": a.get("StringValue"), "dataType": a["DataType"]}
            for name, a in message.get("MessageAttributes", {}).items()
        }
    return event


@dataclass(frozen=True)
class Gcs:
    url: str  # STORAGE_EMULATOR_HOST
    bucket: str  # gs://payloads, created empty
