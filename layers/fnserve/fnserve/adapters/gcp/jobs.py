"""The batch-job function on Google Cloud: Pub/Sub message-published CloudEvents in, results stored.

Each event is one Pub/Sub message (as Eventarc delivers them) whose ``data`` is base64 of one
job, in the SQS job format (:mod:`fnserve.core.jobs.messages`). An instance takes many events at once
(Cloud Run's concurrency): the events that arrive within ``FNSERVE_JOBS_GATHER_MS`` of the first,
and those arriving while a batch runs, are gathered and run as one delivery through the job
processor, so same-shaped jobs become one vectorised runtime call, as an SQS batch does. The
function starts as the SQS one does (:mod:`fnserve.adapters.handler`).

What each event's answer means to Pub/Sub:

- 200 (acknowledged): the job's result is stored, or it was refused (its own fault: stored as
  ``failed`` with the reason, never retried), or its result was already stored (a redelivery,
  skipped: nothing computed or written twice).
- 503 (not acknowledged): a fault that may heal (an S3/GCS/Redis outage, a crashed worker), or a
  message without a job id (nowhere to store its reason). Pub/Sub redelivers with the
  subscription's backoff; on the delivery that reaches ``FNSERVE_MAX_RECEIVE_COUNT`` (set it to
  the dead-letter policy's max delivery attempts) the job is also stored as ``failed`` with the
  reason, and Pub/Sub moves the message to the dead-letter topic, as SQS does to its DLQ.
  Without a dead-letter policy Pub/Sub sends no delivery attempt: every delivery is then
  checked for a stored result, and none is the last.

    functions-framework --target jobs --source functions/gcp_jobs/main.py --signature-type cloudevent
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import time
from collections.abc import Awaitable, Callable

import orjson
from cloudevents.abstract import CloudEvent
from starlette.exceptions import HTTPException

from fnserve.adapters.gcp.logs import use_cloud_logging
from fnserve.adapters.handler import INVOCATION_RESERVE_SECONDS, start_jobs
from fnserve.core.execution.deadline import DEADLINE, Deadline
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.processor import JobProcessor
from fnserve.core.jobs.results import ResultStore
from fnserve.observability.logs import logger
from fnserve.settings import Settings

Record = tuple[str, bytes | str, int]  # what the job processor takes: (message id, body, delivery attempt)


def record_of(event: CloudEvent) -> Record:
    """(message id, job body, delivery attempt) of a Pub/Sub message-published event.

    An event that is not one (no ``message``, data that is not base64) gives an empty body,
    which the processor refuses like any message that is not a job.
    """
    data = event.get_data()
    if isinstance(data, bytes | str):
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError:
            data = None
    if not isinstance(data, dict) or not isinstance(message := data.get("message"), dict):
        return str(event["id"]), b"", 0
    message_id = message.get("messageId") or message.get("message_id") or event["id"]
    try:
        body = base64.b64decode(message.get("data") or b"", validate=True)
    except (binascii.Error, TypeError, ValueError):
        body = b""
    attempt = data.get("deliveryAttempt")
    return str(message_id), body, attempt if isinstance(attempt, int) and attempt > 0 else 0


class Gatherer:
    """Gathers concurrent events into batches for the job processor, one batch running at a time.

    A batch is due ``window`` seconds after its first event arrived (at once when ``max_jobs``
    are waiting) and starts when due and the previous batch has ended; it runs in a thread, so
    the event loop keeps taking events. Each event learns whether its message is to be
    redelivered. (Jobs are not latency-bound: a few milliseconds of gathering buy batches of
    tens of jobs, one vectorised runtime call and one store round trip each.)
    """

    def __init__(self, processor: JobProcessor, *, window: float, max_jobs: int, timeout: float | None = None) -> None:
        self.processor = processor
        self.window = window
        self.max_jobs = max_jobs
        self.timeout = timeout  # how long Pub/Sub's push waits for an event's answer (the function's timeout)
        self._waiting: list[tuple[Record, asyncio.Future[bool]]] = []
        self._arrived: dict[str, float] = {}  # when each waiting event came: its batch's deadline counts from it
        self._timer: asyncio.TimerHandle | None = None
        self._due = False
        self._running: asyncio.Task[None] | None = None
        self._serial = itertools.count()

    async def redeliver(self, record: Record) -> bool:
        """Whether ``record``'s message must be redelivered (False: acknowledge it)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        # A message id may come twice at once (a redelivery while the first is still here): keep them apart.
        key = f"{record[0]}#{next(self._serial)}"
        self._waiting.append(((key, record[1], record[2]), future))
        self._arrived[key] = time.monotonic()
        if len(self._waiting) >= self.max_jobs:
            self._due = True
            self._start()
        elif self._timer is None and not self._due:
            self._timer = loop.call_later(self.window, self._expire)
        return await future

    def _expire(self) -> None:
        self._timer = None
        self._due = True
        self._start()

    def _start(self) -> None:
        if self._running is not None or not self._waiting or not self._due:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting[: self.max_jobs], self._waiting[self.max_jobs :]
        self._due = bool(self._waiting)  # what is left over a full batch has waited long enough
        self._running = asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[Record, asyncio.Future[bool]]]) -> None:
        first = min(self._arrived.pop(record[0]) for record, _ in batch)
        if self.timeout is not None:  # in this task, and the thread it runs the batch in: the jobs not reached by
            # their push's timeout are handed back (503) rather than computed for a delivery Pub/Sub gave up on
            DEADLINE.set(Deadline(first + self.timeout - INVOCATION_RESERVE_SECONDS, "the function's timeout"))
        try:
            outcome = await asyncio.to_thread(self.processor.process, [record for record, _ in batch])
        except Exception as exc:  # a bug, not a job's fault: every message of the batch is redelivered
            logger.exception("job batch failed")
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            failures = set(outcome.failures)
            for record, future in batch:
                if not future.done():  # its request may have gone (the client hung up)
                    future.set_result(record[0] in failures)
            logger.info("batch", extra={"records": len(batch), **outcome.counts()})
        finally:
            self._running = None
            self._start()  # what came meanwhile, if it is due (else its timer starts it)


def create_function(
    service: InferenceService | None = None, settings: Settings | None = None, store: ResultStore | None = None
) -> Callable[[CloudEvent], Awaitable[None]]:
    """The CloudEvent function; build it once per instance, at import (warm globals)."""
    settings, processor = start_jobs(settings, service, store, prepare=use_cloud_logging)
    gatherer = Gatherer(
        processor,
        window=settings.jobs_gather_ms / 1000,
        max_jobs=settings.jobs_max_batch,
        timeout=settings.request_timeout_seconds,
    )

    async def jobs(event: CloudEvent) -> None:
        record = record_of(event)
        if await gatherer.redeliver(record):
            # Not acknowledged: Pub/Sub redelivers it (the reason is in the job's own log line).
            raise HTTPException(503, f"message {record[0]}: not done, to be redelivered")

    return jobs
