"""A batcher's queues, one a shape: the requests waiting (:class:`Pending`), the rows in flight (:class:`InFlight`),
and how a batch gathers from a queue (:func:`gather`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fnserve.core.execution.embeddings import TokenBudget, filled
from fnserve.core.models.datatypes import Arrays

PEAK_SECONDS = 1.0  # how long the most rows seen in flight at once is remembered: what a batch expects
Key = TypeVar("Key", bound=Hashable)  # a queue's shape


@dataclass
class Pending:
    """A request in a batcher's queue, until it is answered."""

    inputs: Arrays
    rows: int
    future: asyncio.Future[tuple[Any, float]]  # its outputs (or what its then made of them), and its wait
    length: int = 0  # of its variable-length inputs (0 when nothing is padded)
    arrived: float = field(default_factory=time.monotonic)
    expiry: asyncio.TimerHandle | None = None  # refuses it at its queue deadline, unless a batch takes it first
    left: bool = False  # answered (or gone): no longer in its flight's rows
    finish: Callable[[Arrays, str | None], Any] | None = None  # what its outputs become, where its batch ran
    bulk: bool = False  # a run of a request cut into several: a request of its own goes first (fresh_first)
    latest: float = math.inf  # a bulk run's latest start for its request to end by its deadline (time.monotonic)


def cancel_expiry(pending: Pending) -> None:
    """A batch took ``pending``: its queue deadline no longer applies (it runs)."""
    if pending.expiry is not None:
        pending.expiry.cancel()
        pending.expiry = None


async def gather(
    queue: asyncio.Queue[Pending],
    flight: InFlight,
    first: Pending,
    deadline: float,
    size: int,
    others: Callable[[], bool],
) -> tuple[list[Pending], int, Pending | None]:
    """A batch from ``first`` on, of ``size`` rows at most: its requests, their rows, and the request that would have
    overflowed it (it starts the next batch), if any. While the queue is empty it waits for the rows on their way,
    until ``deadline`` at most, unless requests of another shape came lately (``others``)."""
    batch, rows = [first], first.rows
    cancel_expiry(first)
    while rows < size:
        if queue.empty():  # wait for the rows on their way, if any, until the deadline at most
            coming = min(size, flight.expected()) - rows
            if coming <= 0 or others():
                break
            await flight.more(coming, deadline)  # all of them, or the deadline: take what came
            if queue.empty():
                break
            continue
        item = queue.get_nowait()
        if item.future.done():
            continue
        if rows + item.rows > size:
            return batch, rows, item  # it would overflow: run what we have
        batch.append(item)
        cancel_expiry(item)
        rows += item.rows
    return batch, rows, None


async def gather_by_length(
    queue: asyncio.Queue[Pending],
    flight: InFlight,
    first: Pending,
    deadline: float,
    size: int,
    budget: TokenBudget,
    padded: Callable[[int], int],
) -> tuple[list[Pending], int]:
    """A batch under a token budget, from one queue of every length: ``first`` (the oldest), then the waiting
    requests nearest its length, while it holds at most ``size`` rows, ``budget`` holds it (padded to ``padded`` of
    its longest length), and at least ``MIN_FILL`` of its padded tokens are real. The others go back to
    the queue in the order they came, so the oldest of them starts the next batch: no long text waits behind a
    stream of short ones. While fewer rows wait than are on their way, it waits for them until ``deadline`` at
    most."""
    cancel_expiry(first)
    waiting: list[Pending] = []
    rows = first.rows
    while True:
        while not queue.empty():
            item = queue.get_nowait()
            if not item.future.done():
                waiting.append(item)
                rows += item.rows
        coming = min(size, flight.expected()) - rows
        if rows >= size or coming <= 0:
            break
        await flight.more(coming, deadline)
        if queue.empty():
            break
    batch, rows, longest = [first], first.rows, first.length
    real = first.length * first.rows  # the batch's tokens before padding
    # Nearest in length first (the sort is stable: among equals, the oldest), so the batch pads little; and never
    # past MIN_FILL: a padded token costs the model as much as a real one, more than a run of its own would.
    for item in sorted(waiting, key=lambda p: abs(p.length - first.length)):
        length, more = max(longest, item.length), rows + item.rows
        # The fill counts the padding joining adds, up to the longest; a GPU's bucket pads every batch alike.
        joined = real + item.length * item.rows
        if more > size or not budget.holds(more, padded(length)) or not filled(joined, more, length):
            continue
        batch.append(item)
        cancel_expiry(item)
        rows, longest, real = more, length, joined
    chosen = {id(p) for p in batch}
    for item in waiting:  # nothing was awaited since the queue was emptied: they go back in their order
        if id(item) not in chosen:
            queue.put_nowait(item)
    return batch, rows


def fresh_first(queue: asyncio.Queue[Pending], first: Pending) -> Pending:
    """The request that starts the next batch, given the queue's oldest (``first``, taken from it): the oldest that
    is not a run of a request cut into several (a query before an ingest's texts), unless ``first`` must start now
    for its request to end by its deadline (its ``latest``); else ``first``. The others stay in the queue in the
    order they came."""
    if not first.bulk or queue.empty() or time.monotonic() >= first.latest:
        return first
    waiting = [first]
    while not queue.empty():
        waiting.append(queue.get_nowait())
    chosen = next((p for p in waiting if not p.bulk and not p.future.done()), first)
    for item in waiting:  # nothing was awaited since the queue was emptied
        if item is not chosen:
            queue.put_nowait(item)
    return chosen


async def first_request(queue: asyncio.Queue[Pending], idle: float) -> Pending | None:
    """The next batch's first request; None when the queue has had none for ``idle`` seconds and is empty (then,
    with no await since that check, no request can join it before its batcher drops it)."""
    while True:
        if not queue.empty():
            return queue.get_nowait()
        try:
            return await asyncio.wait_for(queue.get(), idle)
        except TimeoutError:  # a shape nobody sends any more
            if queue.empty():
                return None


def others_arriving(flights: Mapping[Key, InFlight], key: Key) -> bool:
    """Whether requests of another length or shape than ``key``'s came to the model lately: then a batch forming
    for ``key`` does not wait for rows of its own on their way. In a closed loop of clients the requests that come
    back go to whichever length bucket their texts fall in, mostly another one, and a batch that waits for them
    keeps the model idle while the other buckets' requests wait for it."""
    now = time.monotonic()
    return any(
        flight.rows > flight.running or now - flight.last < PEAK_SECONDS
        for other, flight in flights.items()
        if other != key
    )


def stop_others_waiting(flights: Mapping[Key, InFlight], key: Key) -> None:
    """A request joined ``key``'s queue: a batch of another queue that waits for rows of its own goes on."""
    for other, flight in flights.items():
        if other != key:
            flight.stop_waiting()


class InFlight:
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

    def leave(self, pending: Pending) -> None:
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

    def stop_waiting(self) -> None:
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


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
