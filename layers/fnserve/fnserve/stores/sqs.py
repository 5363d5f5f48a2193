"""Job messages on SQS: `fnserve submit`'s batches and cascade follow-ups, one body format.

A body over SQS's limit is stored in the results bucket and sent as a reference (see
fnserve.core.jobs.messages and :func:`fnserve.stores.objects.job_body`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from fnserve.aws.clients import client
from fnserve.core.jobs.messages import MAX_MESSAGE_BYTES, SubmitReport
from fnserve.observability import tracing
from fnserve.stores.objects import job_body

SEND_BATCH = 10  # SendMessageBatch's limit


class SqsFollowups:
    """Sends cascade follow-up jobs: one SendMessage each, continuing the request's trace.

    The message carries the current span's W3C ``traceparent`` as a message attribute (when
    tracing is on, :mod:`fnserve.observability.tracing`) and, in a Lambda function with X-Ray
    tracing, its trace header as the ``AWSTraceHeader`` system attribute, which X-Ray follows
    into the function that receives the message.
    """

    def __init__(self, bucket: str | None = None) -> None:
        self.bucket = bucket

    def send(self, queue_url: str, job: dict[str, Any]) -> None:
        body, _ = job_body(job, self.bucket, MAX_MESSAGE_BYTES)
        extra: dict[str, Any] = {}
        traceparent = tracing.current_traceparent()
        if traceparent is not None:
            extra["MessageAttributes"] = {tracing.TRACEPARENT: {"DataType": "String", "StringValue": traceparent}}
        xray = os.environ.get("_X_AMZN_TRACE_ID")
        if xray:
            extra["MessageSystemAttributes"] = {"AWSTraceHeader": {"DataType": "String", "StringValue": xray}}
        client("sqs").send_message(QueueUrl=queue_url, MessageBody=body, **extra)


def submit(
    queue_url: str,
    jobs: Iterator[dict[str, Any]],
    report: SubmitReport,
    *,
    bucket: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SubmitReport:
    """Send jobs 10 per SendMessageBatch (a failure SQS did not blame on the sender is retried once); each
    job's id goes to ``report.ids`` once SQS has it, or to ``report.failed`` with the reason. Bodies over
    SQS's limit go to ``bucket`` by reference."""
    sqs = client("sqs")
    batch: list[dict[str, str]] = []

    def flush() -> None:
        if not batch:
            return
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=batch)
        failed = {f["Id"]: f for f in response.get("Failed", [])}
        retry = [e for e in batch if e["Id"] in failed and not failed[e["Id"]].get("SenderFault")]
        if retry:
            response = sqs.send_message_batch(QueueUrl=queue_url, Entries=retry)
            failed = {f["Id"]: f for f in response.get("Failed", [])} | {
                k: v for k, v in failed.items() if v.get("SenderFault")
            }
        for entry in batch:
            job_id = orjson.loads(entry["MessageBody"])["id"]
            if entry["Id"] in failed:
                report.failed[job_id] = str(failed[entry["Id"]].get("Message", "send failed"))
            else:
                report.ids.append(job_id)
        if progress:
            progress(len(batch))
        batch.clear()

    for job in jobs:
        body, by_reference = job_body(job, bucket, MAX_MESSAGE_BYTES)
        report.by_reference += by_reference
        batch.append({"Id": str(len(batch)), "MessageBody": body})
        if len(batch) == SEND_BATCH:
            flush()
    flush()
    return report
