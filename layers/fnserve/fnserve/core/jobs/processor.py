"""The batch job processor: every job of a delivery parsed, one vectorised inference per model, results stored.

Transport-neutral: the SQS handler (``fnserve.adapters.lambda_.sqs``) hands it (message id,
body, receive count) per record and reports the message ids it returns as failures.

A job's own fault (not JSON, an unknown model, tensors that do not fit, a missing or
unreadable S3 object) is its outcome: logged, stored as ``failed`` with the reason under its
id, and not redelivered; it never fails the others. Only what may heal is redelivered: a
fault of the infrastructure (an S3 outage, a crashed worker) or a result that could not be
stored; such a job is stored as ``failed`` on its last delivery. A message without a job id
has nowhere to store its reason, so it is reported until SQS moves it to the dead-letter
queue. Same-shaped jobs are stacked into one runtime call; if a stacked run fails, it is run
again in halves down to the job at fault (:mod:`fnserve.core.execution.runner`).

A job names a model, a pipeline or a cascade, as a request does. A cascade's jobs all run on its
fast model; the ones it is unsure of run on the slow one too (stacked again); each job's result is
the final answer, stored under the model that gave it. No follow-up: the batch pays for the
accurate answer where it is needed, and only there.

Time: where the invocation's deadline is known (:data:`~fnserve.core.execution.deadline.DEADLINE`: Lambda's remaining
time, a Cloud Function's timeout), the jobs run in slices sized from the pace of the slices before, and before
each the processor asks whether it still fits with the time to store the results; when it does not, what ran is
stored and the jobs not reached are handed back (reported as failures, never stored as failed), so no batch
fails whole for want of time. The most delivered jobs run first: a job handed back runs early in its next batch,
and hand-backs do not march a good job into the dead-letter queue.

Idempotency: queues deliver at least once. A redelivered job (receive count above 1, or 0:
not known, as from a Pub/Sub subscription without a dead-letter policy) whose result is
already stored is neither recomputed nor written again; the check is one batched read per
100 redelivered jobs. (Not Powertools' idempotency utility: it makes a conditional write per
record, where this path batches every read and write.)
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fnserve.core.codec.tensors import pack_arrays
from fnserve.core.errors import FnserveError, unknown_model
from fnserve.core.execution.deadline import A_REQUEST, DEADLINE, Deadline
from fnserve.core.execution.service import InferenceService, Packed, Prediction
from fnserve.core.jobs.cascade import confidence, output
from fnserve.core.jobs.messages import Job, JobGroup, PayloadLoader, job_identity, parse_jobs
from fnserve.core.jobs.results import ResultRecord, ResultStore, job_key, job_keys
from fnserve.core.models.manifest.cascades import CascadeSettings

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What happened to one batch: the message ids to report, and counts for metrics."""

    failures: list[str]
    handed_back: int = 0  # jobs not reached in the invocation's time: among the failures, redelivered as they are
    done: int = 0
    refused: int = 0  # the job's own fault, stored as failed (not redelivered)
    skipped: int = 0
    cache_hits: int = 0

    def counts(self) -> dict[str, int]:
        """What the batch log line reports of it."""
        return {
            "done": self.done,
            "refused": self.refused,
            "failed": len(self.failures),
            "handed_back": self.handed_back,
            "skipped": self.skipped,
        }


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

    def select(self, keep: Sequence[int]) -> _Work:
        """The work of only the jobs at positions ``keep``."""
        return _Work(
            self.model,
            self.version,
            self.outputs,
            [self.message_ids[n] for n in keep],
            [self.job_ids[n] for n in keep],
            group=self.group.select(keep) if self.group is not None else None,
            jobs=[self.jobs[n] for n in keep] if self.jobs is not None else None,
        )


class _Results:
    """The records a batch stores, and which message each belongs to (reported if its record is not stored)."""

    def __init__(self, processor: JobProcessor, outcome: Outcome) -> None:
        self.processor = processor
        self.outcome = outcome
        self.records: list[ResultRecord] = []
        self.owners: dict[str, str] = {}
        self.failed = False  # whether any record is a failure
        self.now = int(time.time())

    def done(self, message_ids: Sequence[str], job_ids: Sequence[str], named: str, ran: Sequence[Prediction]) -> None:
        """Jobs that ran: each stored under the name it called (``named``), with the model that answered beside it
        (records made in one pass: a batch stores 10,000)."""
        keys = job_keys(job_ids)
        if isinstance(ran, Packed):  # a stack's, by column: no prediction made
            answered_by = ran.model if ran.model != named else None
            jobs: Iterable[tuple[str, bytes, str | None]] = ((ran.version, p, answered_by) for p in ran.packed)
            self.outcome.cache_hits += ran.hits
        else:
            jobs = (
                (
                    p.version,
                    p.packed if p.packed is not None else pack_arrays(p.outputs),
                    p.model if p.model != named else None,
                )
                for p in ran
            )
            self.outcome.cache_hits += sum(p.cache == "hit" for p in ran)
        self.records += ResultRecord.done_many(keys, named, jobs, now=self.now, ttl=self.processor.ttl_seconds)
        self.owners.update(zip(keys, message_ids, strict=True))

    def fail(self, message_id: str, receive_count: int, job_id: str | None, model: str, error: FnserveError) -> None:
        """A job that failed: its own fault (4xx) is its outcome, stored as failed and not redelivered; a fault
        that may heal (5xx: an S3 outage, a crashed worker) is redelivered, and stored as failed on its last
        delivery (after it SQS moves the message to the DLQ). A job without an id goes to the DLQ."""
        own = error.status_code < 500
        logger.warning(
            "job refused" if own else "job failed",
            extra={"message_id": message_id, "job": job_id, "error": error.message},
        )
        if job_id is not None and (own or self.processor.final(receive_count)):
            key = job_key(job_id)
            self.failed = True
            ttl = self.processor.ttl_seconds
            self.records.append(ResultRecord.failed(key, model, error.message, now=self.now, ttl=ttl))
            if own:
                self.owners[key] = message_id
                return
        self.outcome.failures.append(message_id)

    def store(self) -> None:
        """Write every record at once; the messages of those not stored are reported, so SQS redelivers them."""
        not_stored = self.processor.store.put(self.records)
        if not_stored:
            for key in [k for k in self.owners if k in not_stored]:
                self.outcome.failures.append(self.owners.pop(key))
        if self.failed:
            status = {record.key: record.status for record in self.records}  # the last record of a key is stored
            self.outcome.done = sum(status[key] == "done" for key in self.owners)
        else:
            self.outcome.done = len(self.owners)
        self.outcome.refused = len(self.owners) - self.outcome.done


# What a batch keeps of its deadline to store its results (a DynamoDB write of a few thousand records, retried), or
# this share of its time where that is less: a function of a few seconds still runs most of its batch.
STORE_RESERVE_SECONDS = 3.0
STORE_RESERVE_SHARE = 0.2
FIRST_SLICE_ROWS = 64  # a batch's first slice, run before any pace is known, whatever the time: a batch progresses
SLICE_SHARE = 0.25  # each later slice is foreseen to take at most this share of the time left


class _Slices:
    """The work of a batch in slices that fit its ``deadline`` (None: all of it at once): sized from the pace of
    the slices before, each foreseen within a share of the time left less the store's reserve. When the next
    slice of even one job no longer fits, the jobs not reached are handed back (``outcome``'s failures)."""

    def __init__(self, work: list[_Work], deadline: Deadline | None, outcome: Outcome) -> None:
        self.work = work
        self.deadline = deadline
        self.outcome = outcome
        self.rows = self.seconds = 0.0  # rows run in this batch's slices so far, and the seconds they took

    def __iter__(self) -> Iterator[_Work]:
        deadline = self.deadline
        if deadline is None:
            yield from self.work
            return
        reserve = min(STORE_RESERVE_SECONDS, STORE_RESERVE_SHARE * max(deadline.left(), 0.0))
        for n, unit in enumerate(self.work):
            rows = unit.group.rows if unit.group is not None else [1] * len(unit.job_ids)
            start = 0
            while start < len(rows):
                end = self._fits(rows, start, deadline.left() - reserve)
                if end == start:
                    self._hand_back(unit, start, self.work[n + 1 :])
                    return
                started = time.monotonic()
                yield unit if start == 0 and end == len(rows) else unit.select(range(start, end))
                self.rows += sum(rows[start:end])
                self.seconds += time.monotonic() - started
                start = end

    def _fits(self, rows: Sequence[int], start: int, left: float) -> int:
        """Where the next slice from ``start`` ends: the jobs foreseen within a share of ``left``."""
        if not self.rows:  # no pace yet: a small first slice tells it, however little time is left
            budget = FIRST_SLICE_ROWS
        elif left <= 0:
            return start
        else:
            per_row = self.seconds / self.rows
            if per_row * rows[start] > left:  # not even its next job
                return start
            budget = max(rows[start], int(SLICE_SHARE * left / per_row)) if per_row > 0 else sum(rows)
        end, taken = start, 0
        while end < len(rows) and (end == start or taken + rows[end] <= budget):
            taken += rows[end]
            end += 1
        return end

    def _hand_back(self, unit: _Work, start: int, rest: list[_Work]) -> None:
        handed = [*unit.message_ids[start:], *(m for later in rest for m in later.message_ids)]
        self.outcome.failures += handed
        self.outcome.handed_back += len(handed)
        logger.warning(
            "batch out of time: jobs handed back",
            extra={"handed_back": len(handed), "seconds_left": round(self.deadline.left(), 3) if self.deadline else 0},
        )


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
        self.cascades = {c.name: c for c in service.registry.manifest.cascades}

    def process(self, records: Sequence[tuple[str, str | bytes, int]]) -> Outcome:
        """``records``: (message id, body, delivery count) of each message of the batch; a count of 0 means
        not known (checked as a redelivery, and never the last delivery)."""
        # A batch allocates tens of thousands of short-lived, acyclic objects: without this, the cyclic collector
        # runs over them again and again, for nothing.
        paused = gc.isenabled()
        gc.disable()
        # Its runs are jobs, not a caller's request: sliced by the batch's own deadline, never refused as a request.
        jobs = A_REQUEST.set(False)
        try:
            return self._process(records)
        finally:
            A_REQUEST.reset(jobs)
            if paused:
                gc.enable()

    def _process(self, records: Sequence[tuple[str, str | bytes, int]]) -> Outcome:
        outcome = Outcome(failures=[])
        out = _Results(self, outcome)
        position = {record[0]: i for i, record in enumerate(records)}
        # The most delivered first (a count of 0 is not known): a job handed back for time runs early next time.
        records = sorted(records, key=lambda record: -record[2])
        groups, singles = parse_jobs([body for _, body, _ in records], self.load_payload)
        work: list[_Work] = []
        for group in groups:
            ids = [records[i][0] for i in group.indexes]
            work.append(_Work(group.model, group.version, group.outputs, ids, group.ids, group=group))
        alone: dict[tuple[str, str | None, tuple[str, ...] | None], _Work] = {}
        for i, parsed in sorted(singles.items()):
            message_id, body, receive_count = records[i]
            if isinstance(parsed, FnserveError):
                identity = job_identity(body)
                job_id, model = identity if identity is not None else (None, "")
                out.fail(message_id, receive_count, job_id, model, parsed)
                continue
            unit_key = (parsed.model, parsed.version, parsed.outputs)
            if unit_key not in alone:
                alone[unit_key] = _Work(parsed.model, parsed.version, parsed.outputs, [], [], jobs=[])
            alone[unit_key].message_ids.append(message_id)
            alone[unit_key].job_ids.append(parsed.id)
            alone[unit_key].jobs.append(parsed)  # type: ignore[union-attr]
        work += alone.values()
        redelivered = {message_id for message_id, _, count in records if count != 1}
        work = self._without_stored(work, redelivered, outcome)
        receive_counts: dict[str, int] = {}  # made for the first failure
        for unit in _Slices(work, DEADLINE.get(), outcome):
            results = self._run(unit)
            failed = (
                results.failed if isinstance(results, Packed) else any(isinstance(r, FnserveError) for r in results)
            )
            if not failed:
                out.done(unit.message_ids, unit.job_ids, unit.model, results)  # type: ignore[arg-type]
                continue
            for message_id, job_id, result in zip(unit.message_ids, unit.job_ids, results, strict=True):  # in order
                if isinstance(result, FnserveError):
                    receive_counts = receive_counts or {message_id: count for message_id, _, count in records}
                    out.fail(message_id, receive_counts[message_id], job_id, unit.model, result)
                else:
                    out.done((message_id,), (job_id,), unit.model, (result,))
        out.store()
        if len(outcome.failures) > 1:
            outcome.failures.sort(key=position.__getitem__)  # in record order
        return outcome

    def _run(self, unit: _Work) -> Sequence[Prediction | FnserveError]:
        """One result or error per job of ``unit``, whatever its name serves: a model, a pipeline, a cascade."""
        cascade = self.cascades.get(unit.model)
        if cascade is None:
            return self._infer(unit, unit.model, unit.version, unit.outputs)
        if unit.version is not None:
            return [unknown_model(unit.model, unit.version, ": a cascade has no versions")] * len(unit.job_ids)
        return self._cascade(cascade, unit)

    def _infer(
        self, unit: _Work, name: str, version: str | None, outputs: tuple[str, ...] | None, *, pack: bool = True
    ) -> Sequence[Prediction | FnserveError]:
        """One result or error per job of ``unit`` from ``name``; ``pack``: the stacked jobs' outputs packed for
        their records in one pass (what is stored as it comes back)."""
        service = self.service
        try:
            if unit.group is not None:
                group = unit.group
                if service.servable(name, version).stackable:
                    try:  # a run that fails is halved down to the job at fault (the runner's)
                        columns = group.inputs, group.rows
                        return service.infer_columns(name, *columns, version=version, outputs=outputs, pack=pack)
                    except FnserveError:  # the stack does not validate: each job is validated alone
                        pass
                jobs = [job.inputs for job in group.split()]
            else:
                jobs = [job.inputs for job in unit.jobs or []]
            return service.infer_many(name, jobs, version=version, outputs=outputs)
        except FnserveError as exc:  # unknown model or version, unknown outputs: every job of the unit
            return [exc] * len(unit.job_ids)

    def _cascade(self, cascade: CascadeSettings, unit: _Work) -> Sequence[Prediction | FnserveError]:
        """Every job on the fast model, and only those it is unsure of on the slow one: one final answer per
        job, stored under the model that gave it (one stacked call per model, as for any job)."""
        try:
            requested = self.service.servable(cascade.fast, cascade.fast_version).requested(unit.outputs)
        except FnserveError as exc:
            return [exc] * len(unit.job_ids)
        # Not packed: the rule reads the fast answers, and the stored ones keep only the requested outputs.
        fast_answers = self._infer(unit, cascade.fast, cascade.fast_version, None, pack=False)
        answers: list[Prediction | FnserveError] = list(fast_answers)
        ran = [n for n, answer in enumerate(answers) if not isinstance(answer, FnserveError)]
        if not ran:
            return answers
        try:  # the rule over every job's rows at once; a job is sure when all of its rows are
            scores = [output(answers[n].outputs, cascade) for n in ran]  # type: ignore[union-attr]
            sure = confidence(np.concatenate(scores), cascade) >= cascade.threshold
        except FnserveError as exc:  # the fast model lacks the output the rule reads: the cascade cannot serve
            return [exc] * len(unit.job_ids)
        starts = np.cumsum([0, *(len(s) for s in scores[:-1])])
        unsure = [n for n, all_sure in zip(ran, np.logical_and.reduceat(sure, starts), strict=True) if not all_sure]
        if unit.outputs is not None:
            for n in ran:
                fast = answers[n]
                assert not isinstance(fast, FnserveError)
                answers[n] = dataclasses.replace(fast, outputs={name: fast.outputs[name] for name in requested})
        if unsure:
            slow = self._infer(unit.select(unsure), cascade.slow, cascade.slow_version, unit.outputs)
            for n, answer in zip(unsure, slow, strict=True):
                answers[n] = answer
        return answers

    def final(self, receive_count: int) -> bool:
        """Whether this is a message's last delivery (the queue's maxReceiveCount)."""
        return self.max_receive_count is not None and 0 < self.max_receive_count <= receive_count

    def _without_stored(self, work: list[_Work], redelivered: set[str], outcome: Outcome) -> list[_Work]:
        """Drop redelivered jobs whose result is already stored (neither recomputed nor rewritten)."""
        if not redelivered:
            return work
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
                kept.append(unit.select(keep))
        return kept
