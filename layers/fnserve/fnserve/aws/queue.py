"""Job messages on SQS: one body format for `fnserve submit` and cascade follow-ups.

A body over SQS's limit is stored in the results bucket and sent as a reference (see
fnserve.core.jobs and :func:`fnserve.stores.objects.job_body`).
"""

from __future__ import annotations

import os
from typing import Any

from fnserve import tracing
from fnserve.aws.clients import client
from fnserve.core.jobs import MAX_MESSAGE_BYTES
from fnserve.stores.objects import job_body


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
        body, _ = job_body(job, self.bucket, MAX_MESSAGE_BYTES)
        extra: dict[str, Any] = {}
        traceparent = tracing.current_traceparent()
        if traceparent is not None:
            extra["MessageAttributes"] = {tracing.TRACEPARENT: {"DataType": "String", "StringValue": traceparent}}
        xray = os.environ.get("_X_AMZN_TRACE_ID")
        if xray:
            extra["MessageSystemAttributes"] = {"AWSTraceHeader": {"DataType": "String", "StringValue": xray}}
        client("sqs").send_message(QueueUrl=queue_url, MessageBody=body, **extra)
