"""Where a cascade's follow-ups go, chosen by their destination's form: :mod:`fnserve.stores.pubsub` or
:mod:`fnserve.stores.sqs`."""

from __future__ import annotations

from typing import Any


class Followups:
    """Sends cascade follow-ups to their destination: a Pub/Sub topic (``projects/P/topics/T``), else an SQS queue."""

    def __init__(self, bucket: str | None) -> None:
        from fnserve.stores.pubsub import PubsubFollowups  # the client library itself loads on first publish
        from fnserve.stores.sqs import SqsFollowups

        self.sqs = SqsFollowups(bucket)
        self.pubsub = PubsubFollowups(bucket)

    def send(self, destination: str, job: dict[str, Any]) -> None:
        from fnserve.stores.pubsub import is_topic

        (self.pubsub if is_topic(destination) else self.sqs).send(destination, job)
