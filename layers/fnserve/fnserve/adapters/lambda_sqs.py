"""SQS batch jobs: every record of a batch parsed, one vectorised inference per model, results stored.

Records that cannot be run (not JSON, unknown model, tensors that do not fit, a missing S3
object) are reported in ``batchItemFailures`` with their reason logged, and never fail
the others. Jobs whose result could not be stored are reported too, so SQS redelivers
them: nothing is lost. When every record fails, every record is reported (the handler
does not raise): SQS retries them all either way, and each reason is already logged.

Idempotency: SQS delivers at least once. A redelivered record (receive count above 1)
whose job already has a stored result is neither recomputed nor written again; the check
is one BatchGetItem per 100 redelivered records. (Powertools' idempotency utility was
weighed and not used: it makes a conditional PutItem per record, where this path batches
every read and write.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import SQSEvent

from fnserve.adapters.logs import logger
from fnserve.core.errors import ConfigError, FnserveError
from fnserve.core.jobs import Job, PayloadLoader, job_key, parse_job
from fnserve.core.service import InferenceService, Prediction
from fnserve.core.settings import Settings
from fnserve.core.tensors import pack_arrays

Item = dict[str, Any]


class ResultStore(Protocol):
    def get(self, keys: Iterable[str]) -> dict[str, Item]: ...

    def put(self, items: Sequence[Item]) -> set[str]: ...


@dataclass(slots=True)
class Outcome:
    """What happened to one batch: the message ids to report, and counts for metrics."""

    failures: list[str]
    done: int = 0
    skipped: int = 0
    cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class _Record:
    message_id: str
    receive_count: int
    job: Job


class JobProcessor:
    """Runs the jobs of one SQS batch against a service and stores their results."""

    def __init__(
        self,
        service: InferenceService,
        store: ResultStore,
        *,
        ttl_seconds: int,
        load_payload: PayloadLoader | None = None,
    ) -> None:
        self.service = service
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.load_payload = load_payload

    def process(self, records: Iterable[tuple[str, str, int]]) -> Outcome:
        """``records``: (message id, body, receive count) of each SQS record."""
        outcome = Outcome(failures=[])
        parsed: list[_Record] = []
        for message_id, body, receive_count in records:
            try:
                parsed.append(_Record(message_id, receive_count, parse_job(body, self.load_payload)))
            except FnserveError as exc:
                logger.warning("job refused", extra={"message_id": message_id, "error": exc.message})
                outcome.failures.append(message_id)
        parsed = self._without_stored(parsed, outcome)
        groups: dict[tuple[str, str | None, tuple[str, ...] | None], list[_Record]] = {}
        for record in parsed:
            groups.setdefault((record.job.model, record.job.version, record.job.outputs), []).append(record)
        items: list[Item] = []
        owners: dict[str, str] = {}
        now = int(time.time())
        for (model, version, outputs), members in groups.items():
            try:
                results: list[Prediction | FnserveError] = self.service.infer_many(
                    model, [r.job.inputs for r in members], version=version, outputs=outputs
                )
            except FnserveError as exc:  # unknown model or version, unknown outputs: the whole group
                results = [exc] * len(members)
            for record, result in zip(members, results, strict=True):
                key = job_key(record.job.id)
                if isinstance(result, FnserveError):
                    logger.warning(
                        "job failed",
                        extra={"message_id": record.message_id, "job": record.job.id, "error": result.message},
                    )
                    outcome.failures.append(record.message_id)
                    if result.status_code < 500:  # the job itself is wrong: say why where results are read
                        items.append(self._item(key, "failed", model, None, now, error=result.message))
                    continue
                outcome.cache_hits += result.cache == "hit"
                items.append(self._item(key, "done", result.model, result.version, now, pack_arrays(result.outputs)))
                owners[key] = record.message_id
        not_stored = self.store.put(items)
        for key in [k for k in owners if k in not_stored]:  # in record order
            outcome.failures.append(owners.pop(key))
        outcome.done = len(owners)
        return outcome

    def _without_stored(self, records: list[_Record], outcome: Outcome) -> list[_Record]:
        redelivered = [job_key(r.job.id) for r in records if r.receive_count > 1]
        if not redelivered:
            return records
        try:
            stored = self.store.get(redelivered)
        except Exception:  # cannot tell: run them again; the results are the same
            logger.exception("could not check redelivered jobs for stored results")
            return records
        done = {key for key, item in stored.items() if item.get("status") == "done"}
        kept = [r for r in records if job_key(r.job.id) not in done]
        outcome.skipped = len(records) - len(kept)
        return kept

    def _item(
        self,
        key: str,
        status: str,
        model: str,
        version: str | None,
        now: int,
        payload: bytes | None = None,
        error: str | None = None,
    ) -> Item:
        return {
            "pk": key,
            "status": status,
            "model_name": model,
            "model_version": version,
            "payload": payload,
            "error": error,
            "created_at": now,
            "expires_at": now + self.ttl_seconds,
        }


SqsHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


def records_of(event: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(message id, body, receive count) of each record of an SQS event."""
    return [(r.message_id, r.body, int(r.attributes.approximate_receive_count or 1)) for r in SQSEvent(event).records]


def create_handler(
    service: InferenceService | None = None,
    settings: Settings | None = None,
    store: ResultStore | None = None,
    metrics: Metrics | None = None,
) -> SqsHandler:
    """The batch function's handler; build it once, at import."""
    from fnserve.aws import s3
    from fnserve.aws.service import build_service, result_store

    settings = settings or Settings()
    if store is None:
        dynamo = result_store(settings)
        if dynamo is None:
            raise ConfigError("the batch function needs FNSERVE_RESULTS_TABLE: the table results are written to")
        store = dynamo
        service = service or build_service(settings, dynamo)
    service = service or build_service(settings)
    processor = JobProcessor(service, store, ttl_seconds=settings.result_ttl_seconds, load_payload=s3.get_bytes)
    metrics = metrics or Metrics(namespace="fnserve", service="fnserve-batch")

    @logger.inject_lambda_context(clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = records_of(event)
        outcome = processor.process(records)
        metrics.add_metric(name="JobsReceived", unit=MetricUnit.Count, value=len(records))
        metrics.add_metric(name="JobsDone", unit=MetricUnit.Count, value=outcome.done)
        metrics.add_metric(name="JobsFailed", unit=MetricUnit.Count, value=len(outcome.failures))
        metrics.add_metric(name="JobsSkipped", unit=MetricUnit.Count, value=outcome.skipped)
        metrics.add_metric(name="CacheHits", unit=MetricUnit.Count, value=outcome.cache_hits)
        metrics.flush_metrics()
        logger.info(
            "batch",
            extra={
                "records": len(records),
                "done": outcome.done,
                "failed": len(outcome.failures),
                "skipped": outcome.skipped,
            },
        )
        return {"batchItemFailures": [{"itemIdentifier": m} for m in outcome.failures]}

    return handler
