"""The batch job processor: every job of a delivery parsed, one vectorised inference per model, results stored.

Transport-neutral: the SQS handler (``fnserve.adapters.lambda_.sqs``) hands it (message id,
body, receive count) per record and reports the message ids it returns as failures.

Jobs that cannot be run (not JSON, unknown model, tensors that do not fit, a missing S3
object) are failures with their reason logged (and stored as ``failed``), and never fail the
others. Jobs whose result could not be stored are failures too, so the queue redelivers
them: nothing is lost. Same-shaped jobs are stacked into one runtime call; if a stacked run
fails, its jobs are run one by one to find the one at fault.

Idempotency: queues deliver at least once. A redelivered job (receive count above 1) whose
result is already stored is neither recomputed nor written again; the check is one batched
read per 100 redelivered jobs. (Powertools' idempotency utility was weighed and not used: it
makes a conditional write per record, where this path batches every read and write.)
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fnserve.core.errors import FnserveError
from fnserve.core.jobs import Job, JobGroup, PayloadLoader, parse_jobs
from fnserve.core.results import ResultRecord, ResultStore, job_key
from fnserve.core.service import InferenceService, Prediction

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What happened to one batch: the message ids to report, and counts for metrics."""

    failures: list[str]
    done: int = 0
    skipped: int = 0
    cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class _Work:
    """Jobs to run together: a stacked group (fast path), or separately parsed jobs of one model."""

    model: str
    version: str | None
    outputs: tuple[str, ...] | None
    message_ids: list[str]
    job_ids: list[str]
    group: JobGroup | None = None
    jobs: list[Job] | None = None


class JobProcessor:
    """Runs the jobs of one batch (an SQS or Pub/Sub delivery) against a service and stores their results."""

    def __init__(
        self,
        service: InferenceService,
        store: ResultStore,
        *,
        ttl_seconds: int,
        load_payload: PayloadLoader | None = None,
        max_receive_count: int | None = None,
    ) -> None:
        self.service = service
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.load_payload = load_payload
        self.max_receive_count = max_receive_count

    def process(self, records: Sequence[tuple[str, str, int]]) -> Outcome:
        """``records``: (message id, body, delivery count) of each message of the batch."""
        # A batch allocates tens of thousands of short-lived, acyclic objects: without this,
        # the cyclic collector runs over them again and again (it tripled the parse time).
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._process(records)
        finally:
            if paused:
                gc.enable()

    def _process(self, records: Sequence[tuple[str, str, int]]) -> Outcome:
        outcome = Outcome(failures=[])
        receive_counts = {message_id: count for message_id, _, count in records}
        groups, singles = parse_jobs([body for _, body, _ in records], self.load_payload)
        work: list[_Work] = []
        for group in groups:
            ids = [records[i][0] for i in group.indexes]
            work.append(_Work(group.model, group.version, group.outputs, ids, group.ids, group=group))
        alone: dict[tuple[str, str | None, tuple[str, ...] | None], _Work] = {}
        for i, parsed in sorted(singles.items()):
            message_id = records[i][0]
            if isinstance(parsed, FnserveError):
                logger.warning("job refused", extra={"message_id": message_id, "error": parsed.message})
                outcome.failures.append(message_id)
                continue
            unit_key = (parsed.model, parsed.version, parsed.outputs)
            if unit_key not in alone:
                alone[unit_key] = _Work(parsed.model, parsed.version, parsed.outputs, [], [], jobs=[])
            alone[unit_key].message_ids.append(message_id)
            alone[unit_key].job_ids.append(parsed.id)
            alone[unit_key].jobs.append(parsed)  # type: ignore[union-attr]
        work += alone.values()
        redelivered = {records[i][0] for i in range(len(records)) if records[i][2] > 1}
        work = self._without_stored(work, redelivered, outcome)
        records_out: list[ResultRecord] = []
        owners: dict[str, str] = {}
        now = int(time.time())
        ttl = self.ttl_seconds
        for unit in work:
            for message_id, job_id, result in zip(unit.message_ids, unit.job_ids, self._run(unit), strict=True):
                key = job_key(job_id)
                if isinstance(result, FnserveError):
                    logger.warning(
                        "job failed", extra={"message_id": message_id, "job": job_id, "error": result.message}
                    )
                    outcome.failures.append(message_id)
                    # Say why where results are read: at once when the job itself is wrong, and on the
                    # last delivery for everything else (after it, SQS moves the message to the DLQ).
                    if result.status_code < 500 or self._final(receive_counts[message_id]):
                        records_out.append(ResultRecord.failed(key, unit.model, result.message, now=now, ttl=ttl))
                    continue
                outcome.cache_hits += result.cache == "hit"
                records_out.append(
                    ResultRecord.done(key, result.model, result.version, result.outputs, now=now, ttl=ttl)
                )
                owners[key] = message_id
        not_stored = self.store.put(records_out)
        for key in [k for k in owners if k in not_stored]:
            outcome.failures.append(owners.pop(key))
        position = {record[0]: i for i, record in enumerate(records)}
        outcome.failures.sort(key=position.__getitem__)  # in record order
        outcome.done = len(owners)
        return outcome

    def _run(self, unit: _Work) -> Sequence[Prediction | FnserveError]:
        service = self.service
        try:
            if unit.group is not None:
                group = unit.group
                try:
                    return service.infer_stacked(
                        unit.model, group.inputs, group.rows, version=unit.version, outputs=unit.outputs
                    )
                except FnserveError:  # find out which jobs are at fault: run them one by one
                    jobs = [job.inputs for job in group.split()]
            else:
                jobs = [job.inputs for job in unit.jobs or []]
            return service.infer_many(unit.model, jobs, version=unit.version, outputs=unit.outputs)
        except FnserveError as exc:  # unknown model or version, unknown outputs: every job of the unit
            return [exc] * len(unit.job_ids)

    def _final(self, receive_count: int) -> bool:
        return self.max_receive_count is not None and receive_count >= self.max_receive_count

    def _without_stored(self, work: list[_Work], redelivered: set[str], outcome: Outcome) -> list[_Work]:
        """Drop redelivered jobs whose result is already stored (neither recomputed nor rewritten)."""
        keys = [
            job_key(j) for unit in work for m, j in zip(unit.message_ids, unit.job_ids, strict=True) if m in redelivered
        ]
        if not keys:
            return work
        try:
            stored = self.store.get(keys)
        except Exception:  # cannot tell: run them again; the results are the same
            logger.exception("could not check redelivered jobs for stored results")
            return work
        done = {key for key, record in stored.items() if record.status == "done"}
        kept = []
        for unit in work:
            keep = [n for n, j in enumerate(unit.job_ids) if job_key(j) not in done]
            outcome.skipped += len(unit.job_ids) - len(keep)
            if len(keep) == len(unit.job_ids):
                kept.append(unit)
            elif keep:
                kept.append(
                    _Work(
                        unit.model,
                        unit.version,
                        unit.outputs,
                        [unit.message_ids[n] for n in keep],
                        [unit.job_ids[n] for n in keep],
                        group=unit.group.select(keep) if unit.group is not None else None,
                        jobs=[unit.jobs[n] for n in keep] if unit.jobs is not None else None,
                    )
                )
        return kept
