"""Result lookup states in core, without HTTP: done, failed, pending, skipped, expired, unknown."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fnserve.core.jobs.followups import FollowupIds, ResultLookup
from fnserve.core.jobs.results import ResultRecord, job_key
from fnserve.core.models.manifest.cascades import CascadeSettings
from tests.helpers import MemoryStore

CASCADE = CascadeSettings(name="digits", fast="f", slow="s", output="p", threshold=0.5, result_ttl_seconds=600)
NOW = 1_800_000_000


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


IDS = FollowupIds(b"k" * 32)


def lookup(store: MemoryStore, now: float = NOW) -> ResultLookup:
    return ResultLookup(store, IDS, {"digits": CASCADE}, clock=lambda: now)


def test_a_stored_result_is_done_with_its_outputs(store: MemoryStore) -> None:
    outputs = {"label": np.array([7])}
    store.put([ResultRecord.done(job_key("job-1"), "s", "1", outputs, now=NOW, ttl=60)])
    state = lookup(store).look("job-1")
    assert (state.state, state.model) == ("done", "s")
    assert state.record is not None
    np.testing.assert_array_equal(state.record.outputs()["label"], [7])


def test_a_stored_failure_is_failed_with_its_reason(store: MemoryStore) -> None:
    store.put([ResultRecord.failed(job_key("job-2"), "s", "input does not fit", now=NOW, ttl=60)])
    state = lookup(store).look("job-2")
    assert state.state == "failed" and state.record is not None and state.record.error == "input does not fit"


def test_a_minted_pending_id_is_pending_until_its_cascade_stops_keeping_results(store: MemoryStore) -> None:
    pending = IDS.mint("pending", "digits", now=NOW)
    assert lookup(store, NOW + 10).look(pending).state == "pending"
    assert lookup(store, NOW + 10).look(pending).model == "s"  # the slow model will answer
    assert lookup(store, NOW + 601).look(pending).state == "expired"
    store.put([ResultRecord.done(job_key(pending), "s", "1", {"label": np.array([1])}, now=NOW, ttl=60)])
    assert lookup(store, NOW + 601).look(pending).state == "done"  # a stored result wins


def test_a_skipped_id_says_so_without_reading_the_store(store: MemoryStore) -> None:
    skipped = IDS.mint("skipped", "digits", now=NOW)
    state = lookup(store).look(skipped)
    assert (state.state, state.model) == ("skipped", "f") and store.reads == 0


def test_forged_foreign_and_unknown_ids_are_unknown(store: MemoryStore) -> None:
    pending = IDS.mint("pending", "digits", now=NOW)
    forged = pending[:-1] + ("0" if pending[-1] != "0" else "1")
    foreign = FollowupIds(b"other" * 8).mint("pending", "digits", now=NOW)
    of_unknown_cascade = IDS.mint("pending", "gone", now=NOW)
    for result_id in ("nothing-here", forged, foreign, of_unknown_cascade):
        assert lookup(store).look(result_id).state == "unknown", result_id


def test_waiting_returns_as_soon_as_the_result_lands(store: MemoryStore) -> None:
    pending = IDS.mint("pending", "digits")
    waiting = ResultLookup(store, IDS, {"digits": CASCADE})

    async def main() -> tuple[str, int]:
        task = asyncio.create_task(waiting.wait(pending, 600))
        while store.reads < 2:  # it is polling now
            await asyncio.sleep(0.01)
        landed = store.reads
        store.put([ResultRecord.done(job_key(pending), "s", "1", {"label": np.array([3])}, now=NOW, ttl=60)])
        return (await task).state, store.reads - landed

    # Counts, not seconds: polling backs off to one read a second, so a wait that ran on would read hundreds
    # of times; one that stops when the result lands reads it once or twice more.
    state, reads_after = asyncio.run(main())
    assert state == "done" and reads_after <= 2


def test_a_wait_that_runs_out_leaves_the_result_pending(store: MemoryStore) -> None:
    pending = IDS.mint("pending", "digits")
    state = asyncio.run(ResultLookup(store, IDS, {"digits": CASCADE}).wait(pending, 0.2))
    assert state.state == "pending" and 2 <= store.reads <= 6  # backed off: 50, 100, ... ms
