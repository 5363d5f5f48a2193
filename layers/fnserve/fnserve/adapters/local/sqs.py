"""The emulator's SQS event sources: long-poll a queue, assemble a batch, invoke, delete what succeeded.

As Lambda's event source mapping does: a batch is up to BatchSize messages gathered for at
most the batching window; the messages not reported in ``batchItemFailures`` are deleted,
the rest reappear after the visibility timeout and reach the DLQ after maxReceiveCount. A
function error fails the whole batch (nothing is deleted).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fnserve.adapters.local import events
from fnserve.adapters.logs import logger
from fnserve.aws import clients
from fnserve.workers.pool import WorkerPool


@dataclass
class SqsSource:
    """An SQS event source of a function, as the template declares it."""

    function: str
    queue_url: str
    queue_arn: str
    batch_size: int
    window: float
    report_failures: bool


class Poller:
    """One poller of one event source: runs batches one after another until ``stop`` is set."""

    def __init__(self, source: SqsSource, pool: WorkerPool, stop: threading.Event) -> None:
        self.source = source
        self.pool = pool
        self.stop = stop
        self.queue = source.queue_arn.rsplit(":", 1)[-1]

    def run(self) -> None:
        sqs = clients.client("sqs")
        source = self.source
        while not self.stop.is_set():
            batch = list(self._batch(sqs))
            if not batch:
                continue
            try:
                result = self.pool.invoke(events.sqs_event_of_messages(batch, self.queue)).result()
            except Exception as exc:  # a function error fails the whole batch: nothing is deleted
                logger.warning("function %s failed its batch of %d: %s", source.function, len(batch), exc)
                continue
            failed = set()
            if source.report_failures and isinstance(result, dict):
                failed = {f.get("itemIdentifier") for f in result.get("batchItemFailures") or []}
            done = [m for m in batch if m["MessageId"] not in failed]
            for start in range(0, len(done), 10):
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done[start : start + 10])
                ]
                sqs.delete_message_batch(QueueUrl=source.queue_url, Entries=entries)

    def _batch(self, sqs: Any) -> Iterator[dict[str, Any]]:
        """One batch: up to BatchSize messages, gathered for at most the batching window."""
        source = self.source
        got = 0
        first = None
        while got < source.batch_size and not self.stop.is_set():
            left = source.window - (time.monotonic() - first) if first is not None else 1.0
            if first is not None and left <= 0:
                return
            response = sqs.receive_message(
                QueueUrl=source.queue_url,
                MaxNumberOfMessages=min(10, source.batch_size - got),
                WaitTimeSeconds=max(0, min(1, int(left))),
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            messages = response.get("Messages", [])
            yield from messages
            got += len(messages)
            if messages and first is None:
                first = time.monotonic()
            if first is None and not messages:
                return  # nothing waiting: go round (and notice a stop)
            if source.window == 0 and first is not None:
                return
