"""Job messages on SQS: one body format for `fnserve submit` and cascade follow-ups.

A body over SQS's limit is stored in S3 and sent as a reference (see fnserve.core.jobs).
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from fnserve import tracing
from fnserve.aws import s3
from fnserve.aws.clients import client
from fnserve.core.errors import ConfigError
from fnserve.core.jobs import MAX_MESSAGE_BYTES


def job_body(job: dict[str, Any], bucket: str | None) -> tuple[str, bool]:
    """The message body of ``job``, and whether its inputs went to S3 by reference."""
    body = orjson.dumps(job)
    if len(body) <= MAX_MESSAGE_BYTES - 1024:
        return body.decode(), False
    if bucket is None:
        # The deployment's fault, not the job's: it has no bucket for inputs sent by reference.
        raise ConfigError(
            f"job {job['id']} is {len(body)} bytes, over SQS's limit, and no bucket is set for it "
            "(FNSERVE_RESULTS_BUCKET, or --bucket)"
        )
    request = {k: v for k, v in job.items() if k not in ("id", "model", "version")}
    uri = s3.put_bytes(bucket, f"fnserve/jobs/{job['id']}.json", orjson.dumps(request))
    ref = {k: job[k] for k in ("id", "model", "version") if k in job} | {"payload": {"uri": uri}}
    return orjson.dumps(ref).decode(), True


class SqsFollowups:
    """Sends cascade follow-up jobs: one SendMessage each, continuing the request's trace.

    The message carries the current span's W3C ``traceparent`` as a message attribute (when
    tracing is on, :mod:`fnserve.adapters.tracing`) and, in a Lambda function with X-Ray
    tracing, its trace header as the ``AWSTraceHeader`` system attribute, which X-Ray follows
    into the function that receives the message.
    """

    def __init__(self, bucket: str | None = None) -> None:
        self.bucket = bucket

    def send(self, queue_url: str, job: dict[str, Any]) -> None:
        body, _ = job_body(job, self.bucket)
        extra: dict[str, Any] = {}
        traceparent = tracing.current_traceparent()
        if traceparent is not None:
            extra["MessageAttributes"] = {tracing.TRACEPARENT: {"DataType": "String", "StringValue": traceparent}}
        xray = os.environ.get("_X_AMZN_TRACE_ID")
        if xray:
            extra["MessageSystemAttributes"] = {"AWSTraceHeader": {"DataType": "String", "StringValue": xray}}
        client("sqs").send_message(QueueUrl=queue_url, MessageBody=body, **extra)
