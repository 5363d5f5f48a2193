"""Admission alone, over a fake load: the count bound, the time bound, the caller's deadline, the queue deadline."""

from __future__ import annotations

import pytest

from fnserve.core.batching.admission import QUEUE_DELAY, Admission
from fnserve.core.errors import Overloaded


class Load:
    """A batcher's queues as admission reads them, as the test sets them."""

    def __init__(self, queued: int = 0, running: int = 0, free: int = 0) -> None:
        self.rows_queued, self.rows_running, self.free = queued, running, free

    def queued(self) -> int:
        return self.rows_queued

    def running(self) -> int:
        return self.rows_running

    def free_rows(self) -> int:
        return self.free


def admission(
    load: Load, reasons: list[str], max_queue: int | None = None, max_queue_delay: float | None = None
) -> Admission:
    """A model's admission with batches of 2 rows, one at a time."""
    return Admission(
        load,
        name="m",
        max_batch_size=2,
        max_concurrent=1,
        max_queue=max_queue,
        max_queue_delay=max_queue_delay,
        on_shed=reasons.append,
    )


def test_the_count_bound_counts_the_rows_ahead_beyond_those_a_batch_takes_at_once() -> None:
    """Nothing ahead: any request comes in, however big. With rows ahead, those a free slot's batch takes at once
    do not count against ``max_queue``; past the rest the request is refused, and the refusal told."""
    reasons: list[str] = []
    load = Load(queued=0, free=2)
    bounded = admission(load, reasons, max_queue=2)
    assert bounded.refusal(rows=100, read=True) is None
    load.rows_queued = 3
    assert bounded.refusal(rows=1, read=True) is None  # 4 rows: the free slot's batch of 2, and a queue of 2
    load.free = 0  # the slot taken: the same request no longer fits
    refused = bounded.refusal(rows=1, read=True)
    assert isinstance(refused, Overloaded) and "3 rows wait already, 2 at most" in refused.message
    assert reasons == ["queue_full"] and bounded.shed == 1


def test_requests_being_read_count_at_the_rows_requests_brought_lately_until_one_is_read() -> None:
    reasons: list[str] = []
    load = Load(queued=0)
    bounded = admission(load, reasons, max_queue=4)
    for _ in range(10):
        bounded.record_rows(4)  # requests of 4 rows lately
    with bounded.admitted():
        assert bounded.refusal() is not None  # about 4 rows being read, and this one: past the bound
        assert bounded.refusal(rows=1, read=True) is None  # read: those still being read came after it
    assert reasons == ["queue_full"]


def test_the_time_bound_refuses_what_the_pace_foresees_past_a_deadline() -> None:
    """At 0.4 s a row, behind a batch running one row and 2 rows queued, a request would wait 1 s (half the running
    batch's run, then a full batch's) and be answered in 1.8 s: past a queue deadline of 0.9 s it is refused; with
    one of 2 s it comes in, unless its caller waits 1.5 s at most."""
    reasons: list[str] = []
    load = Load(queued=2, running=1)
    timed = admission(load, reasons, max_queue_delay=0.9)
    assert timed.refusal(read=True) is None  # no run yet: no pace to foresee by
    timed.pace.add(2, 0.8)
    assert timed.foreseen_wait(2, 1) == pytest.approx(1.0)
    assert "keep it waiting about 1000 ms, past its queue deadline of 900 ms" in str(timed.refusal(read=True))
    patient = admission(load, reasons, max_queue_delay=2.0)
    patient.pace.add(2, 0.8)
    assert patient.refusal(read=True) is None
    assert "answer it in about 1800 ms, past its deadline of 1500 ms" in str(patient.refusal(read=True, within=1.5))
    assert reasons == ["queue_wait", "queue_wait"]


def test_the_queue_deadline_is_a_second_or_two_full_batches_of_a_slow_model_unless_set() -> None:
    reasons: list[str] = []
    unset = admission(Load(), reasons)
    assert unset.queue_delay() == QUEUE_DELAY
    unset.pace.add(2, 3.0)  # a full batch takes 3 s
    assert unset.queue_delay() == pytest.approx(6.0)
    assert admission(Load(), reasons, max_queue_delay=0.05).queue_delay() == 0.05
    expired = unset.expired(0.05)
    assert "waited 50 ms (max_queue_delay_ms) without a batch" in expired.message
    assert reasons == ["queue_deadline"] and unset.shed == 1
