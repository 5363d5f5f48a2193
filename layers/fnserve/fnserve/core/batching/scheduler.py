"""Adaptive batching: concurrent requests to one model, run as one call (long-lived processes only).

Requests queue per model and shape (:mod:`fnserve.core.execution.stacking`; a shape's queue goes after ``IDLE_SECONDS``
unused). A batch forms when one of the model's ``max_concurrent`` slots is free (over all its length buckets: the
bucket waiting longest goes next), and closes when it holds ``max_batch_size`` rows, when it holds the rows on their
way (the most in flight at once lately, less those running), or ``max_batch_time`` after its first request or after
it could run, if later; never after the last one, so that a steady trickle cannot hold it open. So a lone request
runs at once, paying no window, and a closed loop of N clients runs as batches of N, not as two cohorts of N/2 that
alternate for good. A batch waits for rows on their way only while the model's requests lately were all of its
shape: texts come back in whichever length bucket their next text falls in, and waiting for them idles the model.
A request whose caller has gone before its batch forms is not computed; one the model cannot serve in time is
refused at once (:mod:`fnserve.core.batching.admission`). asyncio objects are made inside the running loop, never
at import.
What each choice was measured to gain, and how to measure it: docs/design/batching.md.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fnserve.core.batching.admission import Admission
from fnserve.core.batching.priority import run_niced
from fnserve.core.batching.queues import (
    InFlight,
    Pending,
    first_request,
    fresh_first,
    gather,
    gather_by_length,
    others_arriving,
    stop_others_waiting,
)
from fnserve.core.errors import InvalidInput
from fnserve.core.execution.runner import Runner, as_error
from fnserve.core.execution.servable import Ran
from fnserve.core.execution.stacking import Failed, QueueKey, Stacking
from fnserve.core.models.datatypes import Arrays

if TYPE_CHECKING:
    from fnserve.core.batching.admission import ArrivingScope
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.models.manifest.models import ModelSettings

Run = Callable[[Arrays], Any]  # a batch's model call: its outputs (awaitable, where the batcher has no offload)
Offload = Callable[..., Awaitable[Any]]  # ``offload(fn, *args)``: ``fn(*args)`` awaited where batches run
IDLE_SECONDS = 300.0  # a shape's queue (and its task) is dropped after this long without a request


def _ignored(*_: object) -> None:
    pass


@dataclass(frozen=True, slots=True)
class BatchObservers:
    """What a batcher tells its watchers (metrics), given when it is built: each batch's rows, each failed batch
    split in halves, and the reason of each refusal. Each does nothing unless given."""

    on_batch: Callable[[int], None] = _ignored
    on_split: Callable[[], None] = _ignored
    on_shed: Callable[[str], None] = _ignored


NO_OBSERVERS = BatchObservers()


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How one model's requests are batched and bounded (its manifest entry's settings, in seconds)."""

    max_batch_size: int  # rows a batch holds at most
    max_batch_time: float  # the longest a batch waits for rows on their way
    max_concurrent: int = 1  # batches of the model that run at once, over all its length buckets
    max_queue: int | None = None  # rows that may wait for a batch (None: bounded by their wait alone)
    max_queue_delay: float | None = None  # the longest a request waits (None: Admission.queue_delay's)
    name: str = "model"

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_batch_time < 0 or self.max_concurrent < 1:
            raise ValueError("max_batch_size and max_concurrent must be >= 1, max_batch_time >= 0")

    @classmethod
    def of(cls, settings: ModelSettings, max_concurrent: int) -> BatchPolicy:
        """The policy of a model's manifest entry (which sets ``max_batch_time_ms``)."""
        assert settings.max_batch_time_ms is not None
        delay = settings.max_queue_delay_ms
        return cls(
            settings.max_batch_size,
            settings.max_batch_time_ms / 1000,
            max_concurrent,
            settings.max_queue_size,
            None if delay is None else delay / 1000,
            settings.name,
        )


class AdaptiveBatcher:
    """Batches one model's requests: it decides when a batch closes, and hands it to its :class:`Runner` (which
    stacks it by its ``stacking``, runs ``run`` once for it, and finishes each request where the batch ran).
    ``offload``: where a batch runs, ``run`` being a plain function (the service's: a thread of the model's
    priority); without one, ``run`` is a coroutine function, awaited on the event loop. The batcher's
    ``admission`` decides which requests come in."""

    def __init__(
        self,
        run: Run,
        policy: BatchPolicy,
        *,
        stacking: Stacking | None = None,
        offload: Offload | None = None,
        observers: BatchObservers = NO_OBSERVERS,
    ) -> None:
        self._run = run
        self._offload = offload
        self.policy = policy
        self.stacking = stacking or Stacking()
        self.observers = observers
        self.runner = Runner(self.stacking, self._split, self._ran)
        self.admission = Admission(
            self,
            name=policy.name,
            max_batch_size=policy.max_batch_size,
            max_concurrent=policy.max_concurrent,
            max_queue=policy.max_queue,
            max_queue_delay=policy.max_queue_delay,
            on_shed=observers.on_shed,
        )
        self._queues: dict[QueueKey, asyncio.Queue[Pending]] = {}
        self._tasks: dict[QueueKey, asyncio.Task[None]] = {}
        self._flights: dict[QueueKey, InFlight] = {}
        self._slots: asyncio.Semaphore | None = None  # batches that may run at once, over every length bucket
        self._running: set[asyncio.Task[None]] = set()
        self.batches = 0  # how many runs, for tests and metrics

    async def predict(
        self,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        finish: Callable[[Arrays, str | None], Any] | None = None,
        within: float | None = None,
        *,
        bulk: bool = False,
        admitted: bool = False,
        latest: float = math.inf,
    ) -> tuple[Any, float]:
        """This request's outputs (or what ``finish`` made of them), and the seconds it waited in the queue.

        ``finish``: what the request's outputs become (its answer, finished and encoded for its transport), computed
        as soon as its batch has run, where it ran (the runner's thread: the ``offload``'s, when the batcher has
        one), not on the event loop, which keeps reading, admitting and refusing requests meanwhile; what it raises
        is this request's error alone. ``within``: the seconds its caller waits for the answer, where it said
        (:meth:`~fnserve.core.batching.admission.Admission.refusal`). ``bulk``: a run of a request cut into several,
        which a request of its own goes before; ``admitted``: a later run of such a request, which its first run
        was admitted for (neither refused nor expired: its caller's deadline bounds it); ``latest``: when such a run
        must start at the latest for its request to end by its deadline (until then requests of their own go first)."""
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        rows = {a.shape[0] for a in arrays.values() if a.ndim}
        if len(rows) != 1:
            raise InvalidInput("batched inputs must agree on their first dimension")
        stacking, admission = self.stacking, self.admission
        length = stacking.length(arrays)
        key = stacking.key(arrays, stacking.bucket(length))
        queue = self._queues.get(key)
        if queue is None:  # created here, inside the running loop
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.policy.max_concurrent)
            queue = self._queues[key] = asyncio.Queue()  # bounded by admission over every bucket, in predict
            flight = self._flights[key] = InFlight()
            self._tasks[key] = asyncio.get_running_loop().create_task(self._loop(queue, key, flight))
        else:
            flight = self._flights[key]
        if not admitted:
            admission.admit(max(rows), read=True, within=within)
            admission.record_rows(max(rows))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Any, float]] = loop.create_future()
        pending = Pending(arrays, rows.pop(), future, length, finish=finish, bulk=bulk, latest=latest)
        if not admitted:
            delay = admission.queue_delay()
            pending.expiry = loop.call_later(delay, self._expire, pending, flight, delay)
        flight.arrive(pending.rows)
        try:
            queue.put_nowait(pending)
            flight.queued(pending.rows)
            if len(self._flights) > 1:
                stop_others_waiting(self._flights, key)
            return await future
        finally:
            flight.leave(pending)
            if pending.expiry is not None:
                pending.expiry.cancel()

    def admitted(self, within: float | None = None) -> ArrivingScope:
        """The admission of a request whose body is not read yet (:meth:`Admission.admitted`)."""
        return self.admission.admitted(within)

    def _expire(self, pending: Pending, flight: InFlight, delay: float) -> None:
        """A request's queue deadline, ``delay`` after it came: still waiting for its batch, it is refused and never
        run."""
        if pending.future.done():
            return
        flight.leave(pending)
        pending.future.set_exception(self.admission.expired(delay))

    def queued(self) -> int:
        """Rows waiting for a batch, over every length bucket."""
        return sum(flight.rows - flight.running for flight in self._flights.values())

    def free_rows(self) -> int:
        """Rows that a batch takes as soon as it forms, not waiting for one to finish: ``max_batch_size`` for each
        slot no running batch holds. The count bound leaves them out: an idle model whose bodies are read slowly
        (beside another model's flood) must not refuse what its next batch would take at once."""
        return (self.policy.max_concurrent - len(self._running)) * self.policy.max_batch_size

    def running(self) -> int:
        """Rows of the batches running now, over every length bucket."""
        return sum(flight.running for flight in self._flights.values())

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._running]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, queue: asyncio.Queue[Pending], key: QueueKey, flight: InFlight) -> None:
        slots = self._slots
        assert slots is not None  # made with the first queue
        carried: Pending | None = None  # the request that would have overflowed the last batch
        while True:
            first = carried if carried is not None else await first_request(queue, IDLE_SECONDS)
            if first is None:  # a shape nobody sends any more: its queue and this task go
                del self._queues[key], self._tasks[key], self._flights[key]
                return
            await slots.acquire()  # a batch is formed only when it can run at once (the slots are the model's)
            first = fresh_first(queue, first)  # what came while the slot was busy: a query before an ingest's runs
            ready = time.monotonic()
            if first.future.done():  # its caller went away (a deadline, a disconnect): not computed
                carried = None
                slots.release()
                continue
            deadline = max(first.arrived, ready) + self.policy.max_batch_time
            size, stacking = self.policy.max_batch_size, self.stacking
            if stacking.budget is not None:  # one queue of every length, cut by what padded tokens cost
                padded = stacking.padded
                batch, rows = await gather_by_length(queue, flight, first, deadline, size, stacking.budget, padded)
                bucket = padded(max(p.length for p in batch))
            else:
                others = functools.partial(others_arriving, self._flights, key)
                batch, rows, carried = await gather(queue, flight, first, deadline, size, others)
                bucket = key[0]
            flight.running += rows  # from now on, not waiting: the batch's task runs them
            task = asyncio.get_running_loop().create_task(self._execute(batch, bucket, flight, rows))
            self._running.add(task)
            task.add_done_callback(functools.partial(self._ended, flight=flight, rows=rows))

    async def _execute(self, batch: list[Pending], bucket: int, flight: InFlight, rows: int) -> None:
        started = time.monotonic()
        try:
            try:
                answers = await self._batch(batch, bucket)
            except Exception as exc:  # not a run's failure (the runner's), but the batch's own: each gets it
                answers = [Failed(as_error(exc))] * len(batch)
            for pending, answer in zip(batch, answers, strict=True):
                self._settle(flight, started, pending, answer)
        finally:
            # Ended as its answers are set, not by the task's done-callback a turn later: in between, its callers'
            # answers are encoded and sent, and a request arriving then must see its slot free (it was refused,
            # with the next batch's rows all waiting and no batch running).
            self._ended(asyncio.current_task(), flight, rows)  # type: ignore[arg-type]

    def _ended(self, task: asyncio.Task[None], flight: InFlight, rows: int) -> None:
        """A batch's task ended (or was cancelled before it began: the batcher closing): its rows and slot are
        free. Once: from the task as its answers are set, then again by its done-callback."""
        if task in self._running:
            self._running.discard(task)
            flight.running -= rows
            assert self._slots is not None
            self._slots.release()

    @property
    def splits(self) -> int:
        """Failed runs split in halves to find the request at fault."""
        return self.runner.splits

    def _split(self) -> None:
        self.observers.on_split()

    def _ran(self, rows: int) -> None:
        """A runtime call for a stack of a batch (all of it, or a half of a failed one) of ``rows`` requests' rows."""
        self.batches += 1
        self.observers.on_batch(rows)

    def _settle(self, flight: InFlight, started: float, pending: Pending, part: Any) -> None:
        """``pending`` answered with ``part`` (its error alone, when a :class:`Failed`); its rows leave the flight."""
        flight.leave(pending)
        if pending.future.done():
            return
        if isinstance(part, Failed):
            pending.future.set_exception(part.error)
        else:
            pending.future.set_result((part, started - pending.arrived))

    def _batch(self, batch: list[Pending], bucket: int) -> Awaitable[list[Any]]:
        """Each request's answer (or :class:`Failed`), the batch run by the runner where batches run."""
        if self._offload is not None:
            return self._offload(self._through_runner, batch, bucket, self._run)
        loop = asyncio.get_running_loop()
        run = self._run

        def on_the_loop(feed: Arrays) -> Arrays:  # from the runner's thread, the coroutine awaited on the loop
            outputs: Arrays = asyncio.run_coroutine_threadsafe(run(feed), loop).result()
            return outputs

        return asyncio.to_thread(self._through_runner, batch, bucket, on_the_loop)

    def _through_runner(self, batch: list[Pending], bucket: int, run: Callable[[Arrays], Arrays]) -> list[Any]:
        """The runner's answers for ``batch``; the batch's time and rows paced (its requests' completions counted in:
        the batch holds its slot until they are done)."""
        started = time.monotonic()
        answers = self.runner.run(batch, functools.partial(self._attempt, run), bucket)
        self.admission.pace.add(sum(p.rows for p in batch), time.monotonic() - started)
        return answers

    def _attempt(self, run: Callable[[Arrays], Any], stacked: Arrays, rows: int) -> Ran:
        """One runtime call for a stack of the batch: its outputs, and the device that ran them where ``run`` says
        (the service's does)."""
        ran = run(stacked)
        return ran if isinstance(ran, Ran) else Ran(ran, None)


# A batch's compute runs on threads of nice BATCH_NICE, and NICE_PER_LEVEL more for each priority level below the
# highest: where the event loop (it reads, admits, refuses and answers requests) and a batch share a CPU, the loop is
# not queued behind the batch for it, and a lower priority model's flood leaves the CPU to the others.
BATCH_NICE = 5
NICE_PER_LEVEL = 5


def batchers_for(
    service: InferenceService, max_concurrent: int, observers: Callable[[str], BatchObservers] | None = None
) -> dict[str, AdaptiveBatcher]:
    """An adaptive batcher for each of ``service``'s models that asks for one (its default version), with up to
    ``max_concurrent`` batches running at once (a worker group's model: its group's workers); ``observers``: what
    each model's batcher tells (metrics), by model name."""
    found = {}
    top = max(m.priority for m in service.registry.manifest.models)
    for name in service.registry.names():
        settings = service.registry.resolve(name)
        if settings.max_batch_time_ms is None:
            continue
        # In a thread the OS favours less than the event loop's, which keeps accepting (and batching, and refusing)
        # requests meanwhile; a lower priority model's lower still, so that its flood leaves the CPU to the others.
        nice = BATCH_NICE + NICE_PER_LEVEL * (top - settings.priority)
        group = service.registry.manifest.group_of(name)  # a worker group's: a batch at once for each worker
        found[name] = AdaptiveBatcher(
            functools.partial(service.run, name),
            BatchPolicy.of(settings, group.workers if group else max_concurrent),
            stacking=Stacking.of(settings),
            offload=functools.partial(run_niced, nice),  # the run, then its requests' answers, in one thread hop
            observers=observers(name) if observers is not None else NO_OBSERVERS,
        )
    return found
