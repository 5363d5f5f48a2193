"""The SQS handler (batch jobs and cascade follow-ups): records in, ``batchItemFailures`` out.

Everything about jobs (parsing, stacking, running, storing, idempotency) is the job
processor's (:mod:`fnserve.core.jobs.processor`), and its start and each invocation's end are the
handler base's (:mod:`fnserve.adapters.handler`); this adapter only takes the records out of
the event and puts the message ids to redeliver into the partial batch response. When every
record fails, every record is reported (the handler does not raise): SQS retries them all
either way, and each reason is already logged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from fnserve.adapters.handler import lambda_handler, start_jobs
from fnserve.adapters.lambda_ import snapstart
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.results import ResultStore
from fnserve.observability import tracing
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
    metrics: Metrics | None = None,
) -> SqsHandler:
    """The batch function's handler; build it once, at import."""
    _, processor = start_jobs(settings, service, store, ready=snapstart.register)
    metrics = metrics or Metrics(  # what the template sets (Powertools' variables), else fnserve's names
        namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "fnserve",
        service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "fnserve-batch",
    )

    def jobs(event: dict[str, Any], context: Any) -> dict[str, Any]:
        started_ns = time.time_ns()
        records = records_of(event)
        outcome = processor.process(records)
        tracing.job_spans(event.get("Records") or (), started_ns, outcome.failures)
        metrics.add_metric(name="JobsReceived", unit=MetricUnit.Count, value=len(records))
        metrics.add_metric(name="JobsDone", unit=MetricUnit.Count, value=outcome.done)
        metrics.add_metric(name="JobsRefused", unit=MetricUnit.Count, value=outcome.refused)
        metrics.add_metric(name="JobsFailed", unit=MetricUnit.Count, value=len(outcome.failures))
        metrics.add_metric(name="JobsSkipped", unit=MetricUnit.Count, value=outcome.skipped)
        metrics.add_metric(name="CacheHits", unit=MetricUnit.Count, value=outcome.cache_hits)
        metrics.flush_metrics()
        logger.info("batch", extra={"records": len(records), **outcome.counts()})
        return {"batchItemFailures": [{"itemIdentifier": m} for m in outcome.failures]}

    return lambda_handler(jobs)
