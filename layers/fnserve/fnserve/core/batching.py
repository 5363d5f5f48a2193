"""Adaptive batching: concurrent requests to one model, run as one call (long-lived processes only).

Requests queue per model and shape: their length bucket, and the other dimensions of every
input once padded, so that only requests that stack share a batch (a request of another
length without buckets waits in its own queue, never failing a batch it cannot join; a
shape's queue goes after ``IDLE_SECONDS`` unused). A batch closes when it holds ``max_batch_size``
rows, when it holds the rows that were in flight at once lately (the most in the last second or
two, less those running now: the rows on their way), or when ``max_batch_time`` has passed since
its first request, or since it could run if that is later (never since the last one: a steady
trickle cannot hold a batch open). So a lone client's request runs at once, paying no window, and
a closed loop of N clients runs as batches of N: waiting out only the window of a request that
queued while the last batch ran would split them into two cohorts of N/2 for good (MiniLM on 2
cores, 8 or so requests in flight in each front process: batches of 4.3 rows, and 15% fewer
requests a second). A batch waits for rows on their way only while its model's requests lately were all of its
length and shape: those of texts come back in whichever length bucket their next text falls in, and a batch held
for them keeps the model idle while the other buckets wait (it goes on as soon as one of another bucket comes).
Inputs are concatenated along axis 0,
variable-length inputs padded up to their bucket's length so that padding stays small;
outputs are split back by each request's rows, with a check that they split exactly. On a CPU
(``pad_to_bucket`` false) a batch is padded only up to its longest request, not to its bucket: the
bucket groups requests of like length, and every padded token would cost as much as a real one
(MiniLM: a lone 13-token request ran 23% longer padded to 16). A GPU model keeps its bucket lengths,
each warmed at start. With
``batch_buckets``, a batch's rows are padded up to the next bucket (rows of zeros, whose outputs
are dropped), so that a GPU sees a few batch shapes, each warmed at start. A batch whose
run fails is split in halves and each half run again, down to single requests, so an error
reaches only the request that causes it (a token id past the vocabulary fails that request
with its 422, never the 31 beside it; MLServer fans one error out to the whole batch). Up to ``max_concurrent`` batches
of the model run at once, over all its length buckets (one per worker process; in a front process, one:
more would only share its cores); while all are busy, requests queue, the bucket waiting longest goes next,
and the next batch takes whatever has queued, up to ``max_batch_size``, then waits only for the rows on their
way. A request
whose caller has gone (its future cancelled: a gRPC deadline, a client that hung up) before its
batch forms is dropped, not computed. Past its bounds a request is refused at once (:meth:`AdaptiveBatcher.admit`):
the rows ahead of it foreseen, at the pace of the latest runs, to keep it waiting past the queue deadline, or to
answer it past its caller's own deadline, or, with a count bound, the queue full; so that under overload the
excess hears at once instead of after waiting out the deadline. A bound on time, not on rows, refuses a closed loop
of clients (each waits for its answer before sending again) only where its answers come slower than the deadline:
a count near a batch refuses more clients than a batch whenever the batch running is not full. One admitted that
still waits past its queue deadline is refused then, never run. asyncio objects are made inside the running loop,
on first use, never at import.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from fnserve.core._niced import run_niced
from fnserve.core._rows import split_rows
from fnserve.core.datatypes import Arrays
from fnserve.core.errors import FnserveError, InferenceError, InvalidInput, ModelNotReady, Overloaded
from fnserve.core.providers import RAN_ON, RanOn

if TYPE_CHECKING:
    from fnserve.core.service import InferenceService

Runner = Callable[[Arrays], Awaitable[Arrays]]
# A batch's run, then ``after`` on its outputs, in one call where the run happens (one thread hop, not two).
RunThen = Callable[[Arrays, Callable[[Arrays], list[Any]]], Awaitable[list[Any]]]
_Key = tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]  # length bucket, and each input's padded row shape
IDLE_SECONDS = 300.0  # a shape's queue (and its task) is dropped after this long without a request
PACE_WEIGHT = 0.2  # how much each run moves the model's pace (exponential averages of the latest runs)
PEAK_SECONDS = 1.0  # how long the most rows seen in flight at once is remembered: what a batch expects
QUEUE_DELAY = 1.0  # the longest a request waits for its batch unless max_queue_delay says (AdaptiveBatcher.queue_delay)


class _Flight:
    """One queue's rows in flight (queued, or in a batch that runs), the most there were at once lately, and the rows
    of the batches running now. A batch about to form waits for the rows that are coming (the most lately, less those
    running), and no longer: a lone client's request runs at once, and a closed loop of N clients, whose answers come
    back as N requests a little apart, runs as one batch of N, not as two cohorts of N/2 that alternate."""

    def __init__(self) -> None:
        self.rows = 0
        self.running = 0
        self._peak = 0
        self._previous = 0
        self._since = time.monotonic()
        self.last = 0.0  # when a request last came (time.monotonic)
        self._waiter: asyncio.Future[None] | None = None  # a forming batch's, while it waits for rows
        self._needed = 0

    def arrive(self, rows: int) -> None:
        self.rows += rows
        now = self.last = time.monotonic()
        if now - self._since > PEAK_SECONDS:
            recent = now - self._since < 2 * PEAK_SECONDS
            self._previous, self._peak, self._since = self._peak if recent else 0, 0, now
        self._peak = max(self._peak, self.rows)

    def leave(self, pending: _Pending) -> None:
        """``pending`` is answered, refused or gone: its rows leave the flight (once), as its answer is set, so that
        rows waiting (in flight, less running) never counts a batch that has just finished."""
        if not pending.left:
            pending.left = True
            self.rows -= pending.rows

    def expected(self) -> int:
        """Rows a batch forming now may expect to gather: the most in flight lately, less the rows running."""
        return max(self._peak, self._previous, self.rows) - self.running

    def queued(self, rows: int) -> None:
        """``rows`` joined the queue: a batch waiting for them goes on once it has all it waits for."""
        if self._waiter is not None:
            self._needed -= rows
            if self._needed <= 0:
                _wake(self._waiter)

    def hurry(self) -> None:
        """A batch waiting for rows of its own goes on with those it has (requests of another queue came)."""
        if self._waiter is not None:
            _wake(self._waiter)

    async def more(self, rows: int, deadline: float) -> None:
        """Until ``rows`` more rows join the queue, or ``deadline`` (``time.monotonic``): one future and one timer a
        batch, not a task and a timer a request as ``asyncio.wait_for(queue.get())`` would cost."""
        left = deadline - time.monotonic()
        if left <= 0:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._needed = rows
        timer = loop.call_later(left, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


@dataclass
class _Pending:
    inputs: Arrays
    rows: int
    future: asyncio.Future[tuple[Any, float]]  # its outputs (or what its then made of them), and its wait
    ran_on: RanOn | None  # the request's: told which device ran its batch
    length: int = 0  # of its variable-length inputs (0 when nothing is padded)
    arrived: float = field(default_factory=time.monotonic)
    expiry: asyncio.TimerHandle | None = None  # refuses it at its queue deadline, unless a batch takes it first
    left: bool = False  # answered (or gone): no longer in its flight's rows
    then: Callable[[Arrays], Any] | None = None  # what its outputs become, where its batch ran (predict's)


@dataclass(slots=True)
class _Failed:
    """A request's ``then`` that raised: its error alone, the batch's other answers kept."""

    error: Exception


def _completed(then: Callable[[Arrays], Any] | None, part: Arrays) -> Any:
    if then is None:
        return part
    try:
        return then(part)
    except Exception as exc:
        return _Failed(exc)


def _taken(pending: _Pending) -> None:
    """A batch took ``pending``: its queue deadline no longer applies (it runs)."""
    if pending.expiry is not None:
        pending.expiry.cancel()
        pending.expiry = None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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


class _Arriving:
    """The scope of admitted requests whose bodies are being read: counted as coming to the batcher's queue.
    One per batcher, holding nothing of a request's: a request's admission allocates nothing."""

    __slots__ = ("_batcher",)

    def __init__(self, batcher: AdaptiveBatcher) -> None:
        self._batcher = batcher

    def __enter__(self) -> None:
        self._batcher.arriving += 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._batcher.arriving -= 1


class Pace:
    """How long a model's run of so many rows takes, fitted to its latest runs: a fixed cost and a cost a row
    (least squares on exponential averages), or, while the runs were all of one size, a cost a row up to that size
    and their time past it. Wall time in the server, whatever else took the CPU meanwhile: what a request queued
    behind them will wait."""

    def __init__(self) -> None:
        self.runs = 0
        self._rows = self._seconds = self._squares = self._products = 0.0  # averages of n, t, n² and n·t

    def add(self, rows: int, seconds: float) -> None:
        weight = PACE_WEIGHT if self.runs else 1.0
        self.runs += 1
        self._rows += weight * (rows - self._rows)
        self._seconds += weight * (seconds - self._seconds)
        self._squares += weight * (rows * rows - self._squares)
        self._products += weight * (rows * seconds - self._products)

    def seconds(self, rows: int) -> float:
        """What a run of ``rows`` takes (0 before any run)."""
        if not self.runs:
            return 0.0
        spread = self._squares - self._rows * self._rows
        if spread > 0.25:  # runs of several sizes: how their times grew with their rows
            per_row = max(0.0, (self._products - self._rows * self._seconds) / spread)
            return max(0.0, self._seconds - per_row * self._rows) + per_row * rows
        # How a run's time grows past the size seen is not known yet, and a guess must not refuse: a lone first
        # request's fixed cost, counted again for every row of a full batch, refused a closed loop as it started.
        return self._seconds * min(1.0, rows / self._rows)


class AdaptiveBatcher:
    """Batches one model's requests; ``run`` does the inference of a whole batch."""

    def __init__(
        self,
        run: Runner,
        *,
        max_batch_size: int,
        max_batch_time: float,
        buckets: Sequence[int] = (),
        batch_buckets: Sequence[int] = (),
        pad_inputs: Sequence[str] = (),
        pad_value: float = 0.0,
        pad_to_bucket: bool = True,
        max_queue: int | None = None,
        max_queue_delay: float | None = None,
        max_concurrent: int = 1,
        name: str = "model",
        run_then: RunThen | None = None,
        observers: BatchObservers = NO_OBSERVERS,
    ) -> None:
        if max_batch_size < 1 or max_batch_time < 0 or max_concurrent < 1:
            raise ValueError("max_batch_size and max_concurrent must be >= 1, max_batch_time >= 0")
        self._run = run
        self._run_then = run_then
        self.max_batch_size = max_batch_size
        self.max_batch_time = max_batch_time
        self.buckets = sorted(buckets)
        self.batch_buckets = sorted(batch_buckets)
        self.pad_inputs = tuple(pad_inputs)
        self.pad_value = pad_value
        self.pad_to_bucket = pad_to_bucket
        self.max_queue = max_queue
        self.max_queue_delay = max_queue_delay  # None: QUEUE_DELAY, or more for a slow model (queue_delay)
        self.name = name
        self.max_concurrent = max_concurrent
        self._queues: dict[_Key, asyncio.Queue[_Pending]] = {}
        self._tasks: dict[_Key, asyncio.Task[None]] = {}
        self._flights: dict[_Key, _Flight] = {}
        self._slots: asyncio.Semaphore | None = None  # batches that may run at once, over every length bucket
        self._running: set[asyncio.Task[None]] = set()
        self.batches = 0  # how many runs, for tests and metrics
        self.splits = 0  # failed runs split in halves to find the request at fault
        self.observers = observers
        self.shed = 0  # requests refused: their wait foreseen past a deadline, the deadline passed, or the queue full
        self.pace = Pace()  # what a run of so many rows takes: how long the queue will keep a request
        self.arriving = 0  # requests let in whose bodies are being read, not queued yet (admitted's scope)
        self._arriving = _Arriving(self)
        self.request_rows = 1.0  # the rows a request brought lately: what one arriving will add to the queue

    async def predict(
        self,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        then: Callable[[Arrays], Any] | None = None,
        within: float | None = None,
    ) -> tuple[Any, float]:
        """This request's outputs (or what ``then`` made of them), and the seconds it waited in the queue.

        ``then``: what the request's outputs become (its answer, finished and encoded for its transport), computed
        as soon as its batch has run, where it ran (in ``run_then``'s thread, when the batcher has one), not on the
        event loop, which keeps reading, admitting and refusing requests meanwhile; what it raises is this request's
        error alone. ``within``: the seconds its caller waits for the answer, where it said (:meth:`refusal`)."""
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        rows = {a.shape[0] for a in arrays.values() if a.ndim}
        if len(rows) != 1:
            raise InvalidInput("batched inputs must agree on their first dimension")
        length = self._length(arrays)
        bucket = self._bucket(length)
        key = (bucket, tuple((name, self._row_shape(a, name, bucket)) for name, a in sorted(arrays.items())))
        queue = self._queues.get(key)
        if queue is None:  # created here, inside the running loop
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.max_concurrent)
            queue = self._queues[key] = asyncio.Queue()  # bounded by admit over every bucket, in predict
            flight = self._flights[key] = _Flight()
            self._tasks[key] = asyncio.get_running_loop().create_task(self._loop(queue, key, flight))
        else:
            flight = self._flights[key]
        self.admit(max(rows), read=True, within=within)
        self.request_rows += PACE_WEIGHT * (max(rows) - self.request_rows)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Any, float]] = loop.create_future()
        pending = _Pending(arrays, rows.pop(), future, RAN_ON.get(), length, then=then)
        delay = self.queue_delay()
        pending.expiry = loop.call_later(delay, self._expire, pending, flight, delay)
        flight.arrive(pending.rows)
        try:
            queue.put_nowait(pending)
            flight.queued(pending.rows)
            if len(self._flights) > 1:
                self._hurry(key)
            return await future
        finally:
            flight.leave(pending)
            if pending.expiry is not None:
                pending.expiry.cancel()

    def admitted(self, within: float | None = None) -> _Arriving:
        """Admit a request whose body is not read yet, or raise :meth:`refusal`'s :class:`Overloaded`; then, in
        the scope it returns (``with``), the request counts as coming to the queue while its body is read.
        ``within``: the seconds its caller waits, where known before the body (gRPC's deadline)."""
        self.admit(within=within)
        return self._arriving

    def admit(self, rows: int = 1, read: bool = False, within: float | None = None) -> None:
        """Raise :meth:`refusal`'s :class:`Overloaded`, if it has one."""
        refusal = self.refusal(rows, read, within)
        if refusal is not None:
            raise refusal

    def refusal(self, rows: int = 1, read: bool = False, within: float | None = None) -> Overloaded | None:
        """The refusal (counted, not raised) of a request of ``rows`` that cannot be served in time, instead of
        letting it wait behind work that cannot finish; None when it may come in. Refused: the rows ahead of it
        (queued, and those of the requests still being read, at the rows a request brought lately) would, at the
        pace of the latest runs, keep it waiting past the queue deadline (:meth:`queue_delay`), or answer it past
        ``within`` (the seconds its caller waits, where it said: a gRPC deadline, Triton's ``timeout``), or, with a
        count bound, go past ``max_queue`` (beyond those a batch takes as soon as it forms, :meth:`free_rows`).
        Counting the requests being read keeps a burst of large bodies from all passing at once, to be decoded and
        then refused. An empty queue takes any request (one bigger than the bound still runs). The data plane asks
        before reading a request's body (one row: all it knows then), and :meth:`predict` with its rows once
        ``read`` (then the requests still being read came after it, and do not count)."""
        waiting = self.queued()
        ahead = waiting if read else waiting + round(self.arriving * self.request_rows)
        if not ahead:
            return None
        if self.max_queue is not None and ahead + rows > self.max_queue + self.free_rows():
            self._refuse("queue_full")
            return Overloaded(
                f"model {self.name!r} is overloaded: {ahead} rows wait already, {self.max_queue} at most "
                "(max_queue_size); try again shortly"
            )
        if not self.pace.runs:
            return None
        wait, delay = self.foreseen_wait(ahead, rows), self.queue_delay()
        if wait > delay:
            self._refuse("queue_wait")
            return Overloaded(
                f"model {self.name!r} is overloaded: the {ahead} rows ahead would keep it waiting about "
                f"{wait * 1e3:.0f} ms, past its queue deadline of {delay * 1e3:.0f} ms "
                "(max_queue_delay_ms); try again shortly"
            )
        # Its own batch's run too: the caller waits for the answer, not for the batch to take it.
        answered = wait + self.pace.seconds(min(ahead + rows, self.max_batch_size))
        if within is not None and answered > within:
            self._refuse("queue_wait")
            return Overloaded(
                f"model {self.name!r} is overloaded: the {ahead} rows ahead would answer it in about "
                f"{answered * 1e3:.0f} ms, past its deadline of {within * 1e3:.0f} ms; try again shortly"
            )
        return None

    def queue_delay(self) -> float:
        """The longest a request waits for its batch: ``max_queue_delay`` where set, else ``QUEUE_DELAY`` or, for a
        model slower than that, a full batch's run twice at the latest pace (the batch running, then its own: a
        queue of one batch is never refused on time, however slow the model)."""
        if self.max_queue_delay is not None:
            return self.max_queue_delay
        return max(QUEUE_DELAY, 2 * self.pace.seconds(self.max_batch_size))

    def foreseen_wait(self, ahead: int, rows: int) -> float:
        """Seconds until a batch takes a request of ``rows`` that queues behind ``ahead`` rows: half the running
        batches' run (on average), then a full batch's run for each batch that must form before its own."""
        running = self.running()
        before = (ahead + rows - 1) // self.max_batch_size  # batches of the rows ahead that leave it out
        wait = (self.pace.seconds(running) / 2 if running else 0.0) + before * self.pace.seconds(self.max_batch_size)
        return wait / self.max_concurrent

    def _expire(self, pending: _Pending, flight: _Flight, delay: float) -> None:
        """A request's queue deadline, ``delay`` after it came: still waiting for its batch, it is refused and never
        run."""
        if pending.future.done():
            return
        flight.leave(pending)
        self._refuse("queue_deadline")
        pending.future.set_exception(
            Overloaded(
                f"model {self.name!r} is overloaded: the request waited {delay * 1e3:.0f} ms "
                "(max_queue_delay_ms) without a batch; try again shortly"
            )
        )

    def _refuse(self, reason: str) -> None:
        self.shed += 1
        self.observers.on_shed(reason)

    def queued(self) -> int:
        """Rows waiting for a batch, over every length bucket."""
        return sum(flight.rows - flight.running for flight in self._flights.values())

    def free_rows(self) -> int:
        """Rows that a batch takes as soon as it forms, not waiting for one to finish: ``max_batch_size`` for each
        slot no running batch holds. Those ahead of a request within them do not count against ``max_queue``: a
        model that is idle while another model's flood slows the reading of its requests (four 256-row bodies
        being read at once fill a queue of one 1,024-row batch) takes a fifth: it waits for that one batch alone,
        as a queue of one batch means."""
        return (self.max_concurrent - len(self._running)) * self.max_batch_size

    def running(self) -> int:
        """Rows of the batches running now, over every length bucket."""
        return sum(flight.running for flight in self._flights.values())

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._running]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _length(self, inputs: Arrays) -> int:
        """The length of this request's variable-length inputs (0 when nothing is padded)."""
        lengths = [inputs[name].shape[1] for name in self.pad_inputs if name in inputs and inputs[name].ndim > 1]
        return max(lengths, default=0)

    def _bucket(self, length: int) -> int:
        """The padded length of a request whose variable-length inputs are ``length`` long (0: nothing padded)."""
        if not length:
            return 0
        i = bisect.bisect_left(self.buckets, length)
        return self.buckets[i] if i < len(self.buckets) else length  # longer than every bucket: alone

    async def _loop(self, queue: asyncio.Queue[_Pending], key: _Key, flight: _Flight) -> None:
        bucket = key[0]
        slots = self._slots
        assert slots is not None  # made with the first queue
        carried: _Pending | None = None  # the request that would have overflowed the last batch

        while True:
            if carried is None:
                if not queue.empty():
                    carried = queue.get_nowait()
                else:
                    try:
                        carried = await asyncio.wait_for(queue.get(), IDLE_SECONDS)
                    except TimeoutError:  # a shape nobody sends any more: its queue and this task go
                        if queue.empty():  # no await since the check: no request can join it now
                            del self._queues[key], self._tasks[key], self._flights[key]
                            return
                        continue
            await slots.acquire()  # a batch is formed only when it can run at once (the slots are the model's)
            ready = time.monotonic()
            first, carried = carried, None
            if first.future.done():  # its caller went away (a deadline, a disconnect): not computed
                slots.release()
                continue
            batch, rows = [first], first.rows
            _taken(first)
            deadline = max(first.arrived, ready) + self.max_batch_time
            while rows < self.max_batch_size:
                if queue.empty():  # wait for the rows on their way, if any, until the deadline at most
                    coming = min(self.max_batch_size, flight.expected()) - rows
                    if coming <= 0 or self._mixed(key):
                        break
                    await flight.more(coming, deadline)  # all of them, or the deadline: take what came
                    if queue.empty():
                        break
                    continue
                item = queue.get_nowait()
                if item.future.done():
                    continue
                if rows + item.rows > self.max_batch_size:
                    carried = item  # it would overflow: run what we have; it starts the next batch
                    break
                batch.append(item)
                _taken(item)
                rows += item.rows
            flight.running += rows  # from now on, not waiting: the batch's task runs them
            task = asyncio.get_running_loop().create_task(self._execute(batch, bucket, flight, rows))
            self._running.add(task)
            task.add_done_callback(functools.partial(self._ended, flight=flight, rows=rows))

    def _mixed(self, key: _Key) -> bool:
        """Whether requests of another length or shape came to this model lately: then a batch forming for ``key``
        does not wait for rows of its own on their way. In a closed loop of clients the requests that come back
        go to whichever length bucket their texts fall in, mostly another one, and a batch that waits for them
        keeps the model idle while the other buckets' requests wait for it (MiniLM text over five buckets, 2 CPUs:
        600 requests/s waiting, 770 without; tensors of one length: 850-970 waiting, 790-900 without)."""
        now = time.monotonic()
        return any(
            flight.rows > flight.running or now - flight.last < PEAK_SECONDS
            for other, flight in self._flights.items()
            if other != key
        )

    def _hurry(self, key: _Key) -> None:
        """A request joined ``key``'s queue: a batch of another queue that waits for rows of its own goes on."""
        for other, flight in self._flights.items():
            if other != key:
                flight.hurry()

    async def _execute(self, batch: list[_Pending], bucket: int, flight: _Flight, rows: int) -> None:
        started = time.monotonic()
        ran_on = RanOn()
        RAN_ON.set(ran_on)  # this batch's task: the runner's thread says which device ran it
        try:
            await self._answer(batch, bucket, started, ran_on, flight)
        finally:
            # Ended as its answers are set, not by the task's done-callback a turn later: in between, its callers'
            # answers are encoded and sent, and a request arriving then must see its slot free (it was refused,
            # with the next batch's rows all waiting and no batch running).
            self._ended(asyncio.current_task(), flight, rows)  # type: ignore[arg-type]

    def _ended(self, task: asyncio.Task[None], flight: _Flight, rows: int) -> None:
        """A batch's task ended (or was cancelled before it began: the batcher closing): its rows and slot are
        free. Once: from the task as its answers are set, then again by its done-callback."""
        if task in self._running:
            self._running.discard(task)
            flight.running -= rows
            assert self._slots is not None
            self._slots.release()

    async def _answer(self, batch: list[_Pending], bucket: int, started: float, ran_on: RanOn, flight: _Flight) -> None:
        """Run ``batch`` and answer each of its requests. A failed run is split in halves, each run again,
        until every error lands on the request that causes it: the others of its batch still get their answer."""
        try:
            parts = await self._attempt(batch, bucket)
        except Exception as exc:
            error = exc if isinstance(exc, FnserveError) else InferenceError(f"batched inference failed: {exc}")
            waiting = [p for p in batch if not p.future.done()]
            if len(waiting) > 1 and not isinstance(error, ModelNotReady):  # not loaded: every half would fail alike
                half = len(waiting) // 2
                self.splits += 1
                self.observers.on_split()
                await self._answer(waiting[:half], bucket, started, ran_on, flight)
                await self._answer(waiting[half:], bucket, started, ran_on, flight)
                return
            for pending in waiting:
                flight.leave(pending)
                pending.future.set_exception(error)
            return
        for pending, part in zip(batch, parts, strict=True):
            if pending.ran_on is not None:
                pending.ran_on.device = ran_on.device
            flight.leave(pending)
            if pending.future.done():
                continue
            if isinstance(part, _Failed):
                pending.future.set_exception(part.error)
            else:
                pending.future.set_result((part, started - pending.arrived))

    async def _attempt(self, batch: list[_Pending], bucket: int) -> list[Any]:
        """One runtime call for ``batch``: its requests stacked (padded to the bucket), outputs split back, and each
        request's ``then`` applied to its part (in ``run_then``'s call, when the batcher has one)."""
        self.batches += 1
        names = list(batch[0].inputs)
        rows = [p.rows for p in batch]
        padding = self._batch_padding(sum(rows))
        length = bucket if self.pad_to_bucket else max(p.length for p in batch)
        stacked = {name: self._stack([p.inputs[name] for p in batch], name, length, padding) for name in names}
        self.observers.on_batch(sum(rows))
        thens = [p.then for p in batch]

        def after(outputs: Arrays) -> list[Any]:
            parts = split_rows(outputs, rows + [padding] if padding else rows, "batched inference")
            return [_completed(then, part) for then, part in zip(thens, parts[: len(thens)], strict=True)]

        started = time.monotonic()
        if self._run_then is not None and any(thens):
            answers = await self._run_then(stacked, after)
        else:
            answers = after(await self._run(stacked))
        # Its requests' completions counted in: the batch holds its slot until they are done.
        self.pace.add(sum(rows) + padding, time.monotonic() - started)
        return answers

    def _batch_padding(self, rows: int) -> int:
        """Rows of zeros that bring a batch up to its batch bucket (none past the largest)."""
        i = bisect.bisect_left(self.batch_buckets, rows)
        return self.batch_buckets[i] - rows if i < len(self.batch_buckets) else 0

    def _pads(self, array: np.ndarray[Any, Any], name: str, bucket: int) -> bool:
        return bool(bucket) and name in self.pad_inputs and array.ndim >= 2 and array.shape[1] != bucket

    def _row_shape(self, array: np.ndarray[Any, Any], name: str, bucket: int) -> tuple[int, ...]:
        """The shape of one row of ``array`` once padded to ``bucket`` (without padding it)."""
        if not self._pads(array, name, bucket):
            return tuple(array.shape[1:])
        return (bucket, *array.shape[2:])

    def _stack(self, arrays: list[np.ndarray[Any, Any]], name: str, length: int, padding: int) -> np.ndarray[Any, Any]:
        """``arrays`` one after another along axis 0, each padded to ``length`` along axis 1 when ``name`` is a padded
        input, then ``padding`` rows of zeros (a batch bucket's). Written into one array made at once: ``np.pad``
        a request cost more than the model's whole tokenizer call."""
        first = arrays[0]
        if not padding and not any(self._pads(a, name, length) for a in arrays):
            return first if len(arrays) == 1 else np.concatenate(arrays)
        rows = sum(a.shape[0] for a in arrays)
        shape = (rows + padding, *self._row_shape(first, name, length))
        if first.dtype == object:
            out = np.full(shape, b"", dtype=object)
        else:
            out = np.full(shape, self.pad_value if name in self.pad_inputs else 0, dtype=first.dtype)
        row = 0
        for array in arrays:
            out[(slice(row, row + array.shape[0]), *(slice(0, n) for n in array.shape[1:]))] = array
            row += array.shape[0]
        if padding:
            out[rows:] = b"" if first.dtype == object else 0
        return out


# A batch's compute runs on threads of nice BATCH_NICE, and NICE_PER_LEVEL more for each priority level below the
# highest (about 3x less CPU a level). Where the event loop's thread (it reads, admits, refuses and answers requests)
# and a batch share a CPU, the loop is not queued behind a batch for it: MiniLM overloaded on one core, refusals' p99
# lower in 7 of 8 interleaved rounds (medians of two runs 11.4 -> 6.9 and 7.1 -> 6.6 ms), throughput alike; under a
# closed loop of 16 on two cores, MiniLM's req/s and CPU a request alike.
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
        run = functools.partial(run_niced, nice, service.run, name)
        run_then = functools.partial(run_niced, nice, _run_then, service, name)  # the run, then its answers
        found[name] = AdaptiveBatcher(
            run,
            max_batch_size=settings.max_batch_size,
            max_batch_time=settings.max_batch_time_ms / 1000,
            buckets=settings.length_buckets,
            batch_buckets=settings.batch_buckets,
            pad_inputs=settings.pad_inputs,
            pad_value=settings.pad_value,
            # A GPU sees the bucket lengths it warmed at start; a CPU runs no padding it can do without.
            pad_to_bucket=bool(settings.batch_buckets) or settings.execution_providers != ["CPUExecutionProvider"],
            max_queue=settings.max_queue_size,
            max_queue_delay=None if settings.max_queue_delay_ms is None else settings.max_queue_delay_ms / 1000,
            # A worker group's model: as many batches at once as the group has workers.
            max_concurrent=group.workers if (group := service.registry.manifest.group_of(name)) else max_concurrent,
            name=name,
            run_then=run_then,
            observers=observers(name) if observers is not None else NO_OBSERVERS,
        )
    return found


def _run_then(service: InferenceService, model: str, feed: Arrays, after: Callable[[Arrays], list[Any]]) -> list[Any]:
    return after(service.run(model, feed))
