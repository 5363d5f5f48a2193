"""Job messages on Pub/Sub: ``fnserve submit --topic`` and cascade follow-ups on Google Cloud.

The body is the SQS job's (see :mod:`fnserve.core.jobs.messages`); one over Pub/Sub's 10 MB message
limit goes to the results bucket by reference. The publisher honours ``PUBSUB_EMULATOR_HOST``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import TYPE_CHECKING, Any

from fnserve.core.errors import InvalidInput
from fnserve.core.jobs.messages import SubmitReport
from fnserve.observability import tracing
from fnserve.stores.objects import job_body

if TYPE_CHECKING:
    from google.cloud.pubsub_v1 import PublisherClient


# Pub/Sub's message limit (10 MB, data and attributes together).
MAX_MESSAGE_BYTES = 10_000_000
TOPIC = re.compile(r"^projects/[^/]+/topics/[^/]+$")
# How long a follow-up's publish may take before the fast answer goes back without it.
FOLLOWUP_TIMEOUT_SECONDS = 10.0


def is_topic(destination: str) -> bool:
    """Whether a follow-up destination (or ``--topic``) is a Pub/Sub topic: ``projects/P/topics/T``."""
    return destination.startswith("projects/")


def check_topic(topic: str) -> str:
    if not TOPIC.match(topic):
        raise InvalidInput(f"{topic!r} is not a Pub/Sub topic: projects/PROJECT/topics/TOPIC")
    return topic


@functools.cache
def publisher(max_latency: float) -> PublisherClient:
    """One client per process and batching latency: messages published within ``max_latency`` of each
    other go in one Publish call; at most 1,000 messages or 64 MB wait unsent (publishing then blocks)."""
    from google.cloud import pubsub_v1
    from google.cloud.pubsub_v1.types import BatchSettings, LimitExceededBehavior, PublisherOptions, PublishFlowControl

    return pubsub_v1.PublisherClient(
        batch_settings=BatchSettings(max_messages=1000, max_bytes=MAX_MESSAGE_BYTES, max_latency=max_latency),
        publisher_options=PublisherOptions(
            flow_control=PublishFlowControl(
                message_limit=1000, byte_limit=64 * 1024 * 1024, limit_exceeded_behavior=LimitExceededBehavior.BLOCK
            )
        ),
    )


class PubsubFollowups:
    """Sends cascade follow-up jobs to a topic, each carrying the request's W3C ``traceparent`` as an attribute.

    The publish is waited for (at most :data:`FOLLOWUP_TIMEOUT_SECONDS`): a follow-up must be in
    Pub/Sub before the fast answer promises it; the cascade logs a failure and keeps the fast answer.
    """

    def __init__(self, bucket: str | None = None) -> None:
        self.bucket = bucket

    def send(self, topic: str, job: dict[str, Any]) -> None:
        body, _ = job_body(job, self.bucket, MAX_MESSAGE_BYTES)
        traceparent = tracing.current_traceparent()
        attributes = {tracing.TRACEPARENT: traceparent} if traceparent is not None else {}
        publisher(0.0).publish(check_topic(topic), body.encode(), **attributes).result(FOLLOWUP_TIMEOUT_SECONDS)


def submit(
    topic: str,
    jobs: Iterator[dict[str, Any]],
    report: SubmitReport,
    *,
    bucket: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SubmitReport:
    """Publish jobs (batched by the client, up to 1,000 a call); each job's id goes to ``report.ids`` once
    Pub/Sub has it, or to ``report.failed`` with the reason."""
    client = publisher(0.05)
    check_topic(topic)
    sent: list[tuple[str, futures.Future[str]]] = []
    for job in jobs:
        body, by_reference = job_body(job, bucket, MAX_MESSAGE_BYTES)
        report.by_reference += by_reference
        future = client.publish(topic, body.encode())
        if progress is not None:
            future.add_done_callback(lambda _: progress(1))
        sent.append((job["id"], future))
    for job_id, future in sent:
        try:
            future.result()
        except Exception as exc:  # the topic is missing, or this account may not publish to it
            report.failed[job_id] = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        else:
            report.ids.append(job_id)
    return report
