"""Admission to a batched model's queue: a request it cannot serve in time is refused at once (503), as it arrives.

A request is refused when the rows ahead of it would, at the pace of the model's latest runs (:class:`Pace`), keep
it waiting past its queue deadline (:meth:`Admission.queue_delay`) or answer it past its caller's own deadline, or,
with a count bound (``max_queue_size``), when the queue is full: under overload the excess hears at once instead of
after waiting out the deadline. The bound is on time, not rows, by default: a closed loop of clients (each waits for
its answer before sending again) is then refused only where its answers come slower than the deadline, where a
count near a batch refuses it whenever the batch running is not full. One admitted that still waits past its queue
deadline is refused then, never run (:meth:`Admission.expired`). The figures behind it: docs/design/admission.md.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from fnserve.core.errors import Overloaded

PACE_WEIGHT = 0.2  # how much each run moves the model's pace (exponential averages of the latest runs)
QUEUE_DELAY = 1.0  # the longest a request waits for its batch unless max_queue_delay says (Admission.queue_delay)


class Load(Protocol):
    """What admission reads of its batcher's queues, over every length bucket."""

    def queued(self) -> int:
        """Rows waiting for a batch."""
        ...

    def running(self) -> int:
        """Rows of the batches running now."""
        ...

    def free_rows(self) -> int:
        """Rows that a batch takes as soon as it forms, not waiting for one to finish."""
        ...


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
        # request's fixed cost, counted again for every row of a full batch, would refuse a closed loop as it starts.
        return self._seconds * min(1.0, rows / self._rows)


class ArrivingScope:
    """The scope of admitted requests whose bodies are being read: counted as coming to the queue. One per
    admission, holding nothing of a request's: a request's admission allocates nothing."""

    __slots__ = ("_admission",)

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    def __enter__(self) -> None:
        self._admission.arriving += 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._admission.arriving -= 1


class Admission:
    """Whether a batched model's queue (``load``) takes a request now; refusals counted, each told to ``on_shed``
    with its reason (``queue_full``, ``queue_wait``, ``queue_deadline``). ``max_queue``: a bound on the rows waiting
    (None: none); ``max_queue_delay``: the longest a request waits for its batch (None: :meth:`queue_delay`'s)."""

    def __init__(
        self,
        load: Load,
        *,
        name: str,
        max_batch_size: int,
        max_concurrent: int,
        max_queue: int | None,
        max_queue_delay: float | None,
        on_shed: Callable[[str], None],
    ) -> None:
        self._load = load
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.max_queue_delay = max_queue_delay
        self._on_shed = on_shed
        self.pace = Pace()  # what a run of so many rows takes: how long the queue will keep a request
        self.shed = 0  # requests refused: their wait foreseen past a deadline, the deadline passed, or the queue full
        self.arriving = 0  # requests let in whose bodies are being read, not queued yet (admitted's scope)
        self.request_rows = 1.0  # the rows a request brought lately: what one arriving will add to the queue
        self._arriving = ArrivingScope(self)

    def admitted(self, within: float | None = None) -> ArrivingScope:
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

    def record_rows(self, rows: int) -> None:
        """A request of ``rows`` was read and admitted: what the next ones being read are expected to bring."""
        self.request_rows += PACE_WEIGHT * (rows - self.request_rows)

    def refusal(self, rows: int = 1, read: bool = False, within: float | None = None) -> Overloaded | None:
        """The refusal (counted, not raised) of a request of ``rows`` that cannot be served in time, instead of
        letting it wait behind work that cannot finish; None when it may come in. Refused: the rows ahead of it
        (queued, and those of the requests still being read, at the rows a request brought lately) would, at the
        pace of the latest runs, keep it waiting past the queue deadline (:meth:`queue_delay`), or answer it past
        ``within`` (the seconds its caller waits, where it said: a gRPC deadline, Triton's ``timeout``), or, with a
        count bound, go past ``max_queue`` (beyond those a batch takes as soon as it forms, ``free_rows``).
        Counting the requests being read keeps a burst of large bodies from all passing at once, to be decoded and
        then refused. An empty queue takes any request (one bigger than the bound still runs). The data plane asks
        before reading a request's body (one row: all it knows then), and the batcher with its rows once ``read``
        (then the requests still being read came after it, and do not count)."""
        waiting = self._load.queued()
        ahead = waiting if read else waiting + round(self.arriving * self.request_rows)
        if not ahead:
            return None
        if self.max_queue is not None and ahead + rows > self.max_queue + self._load.free_rows():
            self._refuse("queue_full")
            return Overloaded(
                f"model {self.name!r} is overloaded: {ahead} rows wait already, {self.max_queue} at most "
                "(max_queue_size); try again shortly"
            )
        if not self.pace.runs:
            return None
        return self._late(ahead, rows, within)

    def _late(self, ahead: int, rows: int, within: float | None) -> Overloaded | None:
        """The refusal of a request foreseen to wait past its queue deadline, or to be answered past ``within``."""
        wait, delay = self.foreseen_wait(ahead, rows), self.queue_delay()
        if wait > delay:
            self._refuse("queue_wait")
            return Overloaded(
                f"model {self.name!r} is overloaded: the {ahead} rows ahead would keep it waiting about "
                f"{wait * 1e3:.0f} ms, past its queue deadline of {delay * 1e3:.0f} ms "
                "(max_queue_delay_ms); try again shortly"
            )
        # Its own batch's run too: the caller waits for the answer, not for the batch to take it.
        answer_in = wait + self.pace.seconds(min(ahead + rows, self.max_batch_size))
        if within is not None and answer_in > within:
            self._refuse("queue_wait")
            return Overloaded(
                f"model {self.name!r} is overloaded: the {ahead} rows ahead would answer it in about "
                f"{answer_in * 1e3:.0f} ms, past its deadline of {within * 1e3:.0f} ms; try again shortly"
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
        running = self._load.running()
        before = (ahead + rows - 1) // self.max_batch_size  # batches of the rows ahead that leave it out
        wait = (self.pace.seconds(running) / 2 if running else 0.0) + before * self.pace.seconds(self.max_batch_size)
        return wait / self.max_concurrent

    def expired(self, delay: float) -> Overloaded:
        """The refusal (counted) of a request that waited ``delay``, its queue deadline, without a batch."""
        self._refuse("queue_deadline")
        return Overloaded(
            f"model {self.name!r} is overloaded: the request waited {delay * 1e3:.0f} ms "
            "(max_queue_delay_ms) without a batch; try again shortly"
        )

    def _refuse(self, reason: str) -> None:
        self.shed += 1
        self._on_shed(reason)
