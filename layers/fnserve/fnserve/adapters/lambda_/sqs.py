"""The SQS handler (batch jobs and cascade follow-ups): records in, ``batchItemFailures`` out.

Everything about jobs (parsing, stacking, running, storing, idempotency) is the job
processor's (:mod:`fnserve.core.jobs.processor`), and its start and each invocation's end are the
handler base's (:mod:`fnserve.adapters.handler`); this adapter only takes the records out of
the event and puts the message ids to redeliver into the partial batch response. When every
record fails, every record is reported (the handler does not raise): SQS retries them all
either way, and each reason is already logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fnserve.adapters.handler import lambda_handler, start_jobs
from fnserve.adapters.lambda_ import snapstart
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.results import ResultStore
from fnserve.observability import tracing
from fnserve.observability.emf import EmfWriter
from fnserve.observability.logs import logger
from fnserve.settings import Settings

SqsHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


def records_of(event: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(message id, body, receive count) of each record of an SQS event.

    Plain dict access: in a batch of thousands of records a wrapper object per record shows in profiles, and so
    does parsing a first delivery's count.
    """
    none: dict[str, str] = {}
    return [
        (
            r["messageId"],
            r["body"],
            1 if (n := r.get("attributes", none).get("ApproximateReceiveCount", 1)) == "1" else int(n),
        )
        for r in event.get("Records") or ()
    ]


def create_handler(
    service: InferenceService | None = None,
    settings: Settings | None = None,
    store: ResultStore | None = None,
    metrics: EmfWriter | None = None,
) -> SqsHandler:
    """The batch function's handler; build it once, at import."""
    _, processor = start_jobs(settings, service, store, ready=snapstart.register)
    metrics = metrics or EmfWriter(default_service="fnserve-batch")

    def jobs(event: dict[str, Any], context: Any) -> dict[str, Any]:
        started_ns = time.time_ns()
        records = records_of(event)
        outcome = processor.process(records)
        tracing.job_spans(event.get("Records") or (), started_ns, outcome.failures)
        if not metrics.disabled:
            counts = {
                "JobsReceived": len(records),
                "JobsDone": outcome.done,
                "JobsRefused": outcome.refused,
                "JobsFailed": len(outcome.failures),
                "JobsHandedBack": outcome.handed_back,
                "JobsSkipped": outcome.skipped,
                "CacheHits": outcome.cache_hits,
            }
            metrics.write(metrics.document({}, counts))
        logger.info("batch", extra={"records": len(records), **outcome.counts()})
        return {"batchItemFailures": [{"itemIdentifier": m} for m in outcome.failures]}

    return lambda_handler(jobs)
