"""The emulator's SQS event sources: long-poll a queue, assemble a batch, invoke, delete what succeeded.

As Lambda's event source mapping does: a batch is up to BatchSize messages gathered for at
most the batching window; the messages not reported in ``batchItemFailures`` are deleted,
the rest reappear after the visibility timeout and reach the DLQ after maxReceiveCount. A
function error fails the whole batch (nothing is deleted).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from fnserve.aws import clients, events
from fnserve.observability.logs import logger
from fnserve.workers.pool import Pool


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

    def __init__(self, source: SqsSource, pool: Pool, stop: threading.Event) -> None:
        self.source = source
        self.pool = pool
        self.stop = stop
        self.queue = source.queue_arn.rsplit(":", 1)[-1]

    def run(self) -> None:
        """Poll until stopped. An error (the AWS endpoint unreachable, throttled, or anything else)
        never ends the poller: it backs off and retries, logging once when an outage starts and
        once when it ends; the messages of an unfinished batch reappear after their visibility timeout."""
        outage = _Outage(f"{self.source.function}'s queue {self.queue}")
        while not self.stop.is_set():
            try:
                self._cycle()
            except Exception as exc:  # noqa: BLE001 - a poller must outlive every error
                self.stop.wait(outage.failed(exc))
            else:
                outage.over()

    def _cycle(self) -> None:
        """Receive one batch, invoke the function with it, delete what it did not report."""
        sqs = clients.client("sqs")
        source = self.source
        batch = self._batch(sqs)
        if not batch:
            return
        try:
            result = self.pool.invoke(events.sqs_event_of_messages(batch, self.queue)).result()
        except Exception as exc:  # a function error fails the whole batch: nothing is deleted
            logger.warning("function %s failed its batch of %d: %s", source.function, len(batch), exc)
            return
        failed = set()
        if source.report_failures and isinstance(result, dict):
            failed = {f.get("itemIdentifier") for f in result.get("batchItemFailures") or []}
        done = [m for m in batch if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done[start : start + 10])
            ]
            sqs.delete_message_batch(QueueUrl=source.queue_url, Entries=entries)

    def _batch(self, sqs: Any) -> list[dict[str, Any]]:
        """One batch: up to BatchSize messages, gathered for at most the batching window.

        A receive that fails once messages are in hand ends the batch with them (they are
        processed; the next receive meets the outage).
        """
        source = self.source
        batch: list[dict[str, Any]] = []
        first = None
        while len(batch) < source.batch_size and not self.stop.is_set():
            left = source.window - (time.monotonic() - first) if first is not None else 1.0
            if first is not None and left <= 0:
                break
            try:
                response = sqs.receive_message(
                    QueueUrl=source.queue_url,
                    MaxNumberOfMessages=min(10, source.batch_size - len(batch)),
                    WaitTimeSeconds=max(0, min(1, int(left))),
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                )
            except Exception:
                if batch:
                    break
                raise
            messages = response.get("Messages", [])
            batch += messages
            if messages and first is None:
                first = time.monotonic()
            if first is None and not messages:
                break  # nothing waiting: go round (and notice a stop)
            if source.window == 0 and first is not None:
                break
        return batch


class _Outage:
    """A poller's errors in a row: one warning when they start, one line when they end, and the back-off."""

    FIRST_DELAY = 0.5
    MAX_DELAY = 5.0

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        self.delay = self.FIRST_DELAY

    def failed(self, exc: Exception) -> float:
        """Note a failure; returns how long to wait before the next try (doubling up to MAX_DELAY)."""
        if self.since is None:
            self.since = time.monotonic()
            self.delay = self.FIRST_DELAY
            logger.warning(
                "%s cannot be polled (%s: %s); retrying every %.0f s at most until it answers",
                self.what,
                type(exc).__name__,
                exc,
                self.MAX_DELAY,
            )
        else:
            self.delay = min(self.delay * 2, self.MAX_DELAY)
        return self.delay

    def over(self) -> None:
        """Note a success: the end of an outage, if there was one."""
        if self.since is not None:
            logger.warning("%s is polled again after %.1f s", self.what, time.monotonic() - self.since)
            self.since = None
