"""The adaptive batcher with fake runs: splits, sizes, deadlines, errors, length buckets."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import numpy as np
import pytest

from fnserve.core.batching.admission import Pace
from fnserve.core.batching.scheduler import AdaptiveBatcher, BatchObservers, BatchPolicy
from fnserve.core.errors import InferenceError, InvalidInput, Overloaded, grpc_code
from fnserve.core.execution.embeddings import TokenBudget
from fnserve.core.execution.stacking import Stacking

Arrays = dict[str, np.ndarray]


class Recorder:
    """A fake model: doubles ``x``; records every batch it is given."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[Arrays] = []
        self.delay = delay

    async def __call__(self, feed: Arrays) -> Arrays:
        self.batches.append(feed)
        await asyncio.sleep(self.delay)  # the model's run time, not a wait for a race
        if np.any(feed["x"] < 0):
            raise InvalidInput("negative input")
        return {"y": feed["x"] * 2, "rows": np.arange(feed["x"].shape[0])}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def shed_to(reasons: list[str]) -> BatchObservers:
    """Observers that note each refusal's reason."""
    return BatchObservers(on_shed=reasons.append)


def test_concurrent_requests_share_batches_and_get_exactly_their_rows() -> None:
    model = Recorder(delay=0.01)

    async def main() -> list[tuple[Arrays, float]]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=64, max_batch_time=0.05))
        requests = [{"x": np.full((1 + i % 3, 2), i, np.float32)} for i in range(30)]
        results = await asyncio.gather(*(batcher.predict(r) for r in requests))
        await batcher.close()
        return results

    results = run(main())
    for i, (out, waited) in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((1 + i % 3, 2), 2 * i))
        assert waited >= 0
    assert len(model.batches) < 30
    assert sum(b["x"].shape[0] for b in model.batches) == sum(1 + i % 3 for i in range(30))


def test_batches_never_exceed_max_batch_size() -> None:
    model = Recorder()

    async def main() -> None:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=5, max_batch_time=0.05))
        await asyncio.gather(*(batcher.predict({"x": np.ones((2, 1))}) for _ in range(12)))
        await batcher.close()

    run(main())
    assert all(b["x"].shape[0] <= 5 for b in model.batches)
    assert sum(b["x"].shape[0] for b in model.batches) == 24


def test_the_deadline_counts_from_the_first_request_of_a_batch() -> None:
    model = Recorder()
    window = 0.05

    async def main() -> None:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=10_000, max_batch_time=window))
        started = time.monotonic()
        tasks = []
        while time.monotonic() - started < 0.4:  # a steady trickle, a request every ~10 ms
            stamp = np.array([[time.monotonic()]])
            tasks.append(asyncio.create_task(batcher.predict({"x": stamp})))
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        await batcher.close()

    run(main())
    assert len(model.batches) >= 4  # a trickle cannot hold one batch open
    for batch in model.batches:
        span = float(batch["x"].max() - batch["x"].min())
        assert span <= window + 0.03, span  # every request joined within the window of the first


def test_a_lone_request_runs_at_once_without_waiting_out_the_window() -> None:
    model = Recorder()
    window = 5.0  # were it waited out, the test would take this long and its queue wait would show it

    async def main() -> list[float]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=64, max_batch_time=window))
        waits = []
        for i in range(3):  # one client, one request at a time: nothing else is on its way
            _, waited = await batcher.predict({"x": np.full((1, 1), float(i))})
            waits.append(waited)
        await batcher.close()
        return waits

    waits = run(main())
    assert len(model.batches) == 3 and all(w < window / 2 for w in waits), waits


def test_a_closed_loop_of_clients_runs_as_one_batch_not_two_cohorts() -> None:
    """Eight clients that send again as soon as they are answered, the first ones before the others arrive: their
    answers come back a little apart, and a batch that waits only out the window of a request that queued while the
    last batch ran splits them into two cohorts for good (3 and 5, 3 and 5, ...). Waiting for the rows that were in
    flight lately merges them: batches of 8."""
    model = Recorder(delay=0.05)
    sizes: list[int] = []

    async def client(batcher: AdaptiveBatcher, i: int) -> None:
        await asyncio.sleep(0.006 * i)  # they start apart: 0-42 ms, against a 20 ms window
        for _ in range(16):
            out, _ = await batcher.predict({"x": np.full((1, 1), float(i))})
            assert out["y"][0, 0] == 2 * i
            await asyncio.sleep(0.001)  # the client reads its answer and sends the next request

    async def main() -> None:
        batcher = AdaptiveBatcher(
            model, BatchPolicy(max_batch_size=64, max_batch_time=0.02), observers=BatchObservers(sizes.append)
        )
        await asyncio.gather(*(client(batcher, i) for i in range(8)))
        await batcher.close()

    run(main())
    assert sum(sizes) == 8 * 16
    settled = sizes[4:-2]  # past the staggered start, before the last stragglers
    assert sorted(settled)[len(settled) // 2] == 8, sizes


def test_with_requests_of_other_lengths_about_a_batch_does_not_wait_for_rows_of_its_own() -> None:
    """Requests of one length in flight at once lately make a batch of that length wait for as many to come back;
    when requests of other lengths came too, those coming back mostly land in the other buckets, and the batch
    goes at once: held for them, the model would sit idle while the other buckets' requests wait."""
    model = Recorder()
    window = 5.0  # were it waited out, the test would time out waiting for the answer below

    async def main() -> None:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=64, max_batch_time=window),
            stacking=Stacking(buckets=[4, 8], pad_inputs=["x"]),
        )
        # Four of length 4 in flight at once: a batch of that bucket now expects four.
        await asyncio.gather(*(batcher.predict({"x": np.ones((1, 3))}) for _ in range(4)))
        await batcher.predict({"x": np.ones((1, 7))})  # then one of another length
        out, _ = await asyncio.wait_for(batcher.predict({"x": np.full((1, 3), 2.0)}), window / 2)
        assert out["y"][0, :3].tolist() == [4.0, 4.0, 4.0]
        await batcher.close()

    run(main())
    assert [len(feed["x"]) for feed in model.batches] == [4, 1, 1]


def test_a_batch_waiting_for_rows_of_its_own_goes_on_when_a_request_of_another_length_comes() -> None:
    model = Recorder()
    window = 5.0

    async def main() -> None:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=64, max_batch_time=window),
            stacking=Stacking(buckets=[4, 8], pad_inputs=["x"]),
        )
        await asyncio.gather(*(batcher.predict({"x": np.ones((1, 3))}) for _ in range(4)))  # four expected
        waiting = asyncio.ensure_future(batcher.predict({"x": np.ones((1, 3))}))  # its batch waits for three more
        while not any(flight._waiter for flight in batcher._flights.values()):
            await asyncio.sleep(0)
        other = asyncio.ensure_future(batcher.predict({"x": np.ones((1, 7))}))
        await asyncio.wait_for(asyncio.gather(waiting, other), window / 2)
        await batcher.close()

    run(main())
    assert [len(feed["x"]) for feed in model.batches] == [4, 1, 1]


def test_a_failed_batch_is_split_until_only_its_culprit_fails() -> None:
    model = Recorder(delay=0.02)

    async def main() -> tuple[list[Any], AdaptiveBatcher]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=8, max_batch_time=0.05))
        first = [batcher.predict({"x": np.full((1, 1), -1.0 if i == 5 else float(i))}) for i in range(8)]
        results = await asyncio.gather(*first, return_exceptions=True)
        later = await batcher.predict({"x": np.ones((1, 1))})
        await batcher.close()
        return [*results, later], batcher

    (*batch, later), batcher = run(main())
    assert isinstance(batch[5], InvalidInput)
    for i, result in enumerate(batch):
        if i != 5:
            np.testing.assert_array_equal(result[0]["y"], [[2.0 * i]])
    assert model.batches[0]["x"].shape[0] == 8  # they shared one batch, which failed
    assert batcher.splits == 3  # 8 -> 4 -> 2 -> 1: halves, not one run per request
    assert len(model.batches) == 1 + 2 * 3 + 1  # the failed runs, their good halves, and the later batch
    np.testing.assert_array_equal(later[0]["y"], [[2.0]])


def test_every_culprit_of_a_batch_gets_its_own_error() -> None:
    model = Recorder()

    async def main() -> list[Any]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=16, max_batch_time=0.05))
        bad = {0, 7, 8}
        requests = [batcher.predict({"x": np.full((1, 1), -1.0 if i in bad else 1.0)}) for i in range(16)]
        results = await asyncio.gather(*requests, return_exceptions=True)
        await batcher.close()
        return results

    results = run(main())
    assert [i for i, r in enumerate(results) if isinstance(r, InvalidInput)] == [0, 7, 8]
    assert all(isinstance(r, tuple) for i, r in enumerate(results) if i not in (0, 7, 8))


def test_each_request_s_then_runs_where_its_batch_ran_and_fails_only_its_own_request() -> None:
    """``then`` (the data plane's finishing and encoding) makes each request's answer from its part of the outputs,
    where the batch ran (the batcher's ``offload``, when it has one; else a thread of asyncio's), never on the event
    loop; what it raises reaches its own request, never splitting the batch (the run itself went well)."""
    calls: list[str] = []
    threads: set[int] = set()

    def model(feed: Arrays) -> Arrays:  # a plain function, run where the batcher's offload runs it
        return {"y": feed["x"] * 2, "rows": np.arange(feed["x"].shape[0])}

    async def offload(fn: Any, *args: Any) -> Any:
        calls.append("offload")
        return await asyncio.to_thread(fn, *args)

    def then(part: Arrays, device: str | None) -> float:
        threads.add(threading.get_ident())
        if part["y"][0, 0] == 6.0:
            raise InvalidInput("cannot write this answer")
        return float(part["y"].sum())

    async def main(batcher: AdaptiveBatcher) -> list[Any]:
        requests = [batcher.predict({"x": np.full((1 + i % 2, 1), float(i))}, then) for i in range(5)]
        requests.append(batcher.predict({"x": np.ones((1, 1))}))  # without one: its outputs, as ever
        results = await asyncio.gather(*requests, return_exceptions=True)
        await batcher.close()
        return results

    for with_offload in (True, False):
        calls.clear()
        threads.clear()
        policy = BatchPolicy(max_batch_size=16, max_batch_time=0.05)
        batcher = (
            AdaptiveBatcher(model, policy, offload=offload) if with_offload else AdaptiveBatcher(Recorder(), policy)
        )
        results = run(main(batcher))
        assert [r[0] for r in results[:3]] == [0.0, 4.0, 4.0] and results[4][0] == 8.0
        assert isinstance(results[3], InvalidInput) and results[3].message == "cannot write this answer"
        np.testing.assert_array_equal(results[5][0]["y"], [[2.0]])
        assert (batcher.batches, batcher.splits) == (1, 0)
        assert calls == (["offload"] if with_offload else [])
        assert threading.get_ident() not in threads  # not the event loop's


def test_outputs_that_do_not_split_back_are_refused() -> None:
    async def bad_model(feed: Arrays) -> Arrays:
        return {"y": feed["x"][:1]}

    async def main() -> list[Any]:
        batcher = AdaptiveBatcher(bad_model, BatchPolicy(max_batch_size=8, max_batch_time=0.05))
        results = await asyncio.gather(
            *(batcher.predict({"x": np.ones((2, 1))}) for _ in range(3)), return_exceptions=True
        )
        await batcher.close()
        return results

    results = run(main())
    assert all(isinstance(r, InferenceError) and "does not split back" in r.message for r in results)


def test_length_buckets_group_and_pad() -> None:
    seen: list[np.ndarray] = []

    async def model(feed: Arrays) -> Arrays:
        seen.append(feed["x"])
        return {"y": feed["x"].sum(axis=1)}

    async def main() -> list[tuple[Arrays, float]]:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=100, max_batch_time=0.05),
            stacking=Stacking(buckets=[4, 8], pad_inputs=["x"], pad_value=0.0),
        )
        lengths = [3, 4, 5, 7, 8, 2, 12]
        results = await asyncio.gather(*(batcher.predict({"x": np.ones((1, n))}) for n in lengths))
        await batcher.close()
        return results

    results = run(main())
    assert sorted(x.shape[1] for x in seen) == [4, 8, 12]  # buckets 4 and 8; 12 is longer than any: alone
    assert sorted(x.shape[0] for x in seen) == [1, 3, 3]
    assert [float(r[0]["y"][0]) for r in results] == [3, 4, 5, 7, 8, 2, 12]  # padding added zeros only


def test_on_a_cpu_a_batch_is_padded_to_its_longest_request_not_its_bucket() -> None:
    seen: list[np.ndarray] = []

    async def model(feed: Arrays) -> Arrays:
        seen.append(feed["x"])
        return {"y": feed["x"].sum(axis=1)}

    async def main(pad_to_bucket: bool) -> list[float]:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=8, max_batch_time=0.05),
            stacking=Stacking(buckets=[8, 16], pad_inputs=["x"], pad_to_bucket=pad_to_bucket),
        )
        results = await asyncio.gather(*(batcher.predict({"x": np.ones((1, n))}) for n in (9, 11, 3)))
        await batcher.close()
        return [float(r[0]["y"][0]) for r in results]

    assert run(main(pad_to_bucket=False)) == [9, 11, 3]
    assert sorted(x.shape for x in seen) == [(1, 3), (2, 11)]  # 9 and 11 share bucket 16, padded to 11; 3 alone
    seen.clear()
    assert run(main(pad_to_bucket=True)) == [9, 11, 3]  # a GPU's: the bucket lengths it warmed
    assert sorted(x.shape for x in seen) == [(1, 8), (2, 16)]


class Gate:
    """A fake model that holds every batch until the test opens the gate; counts batches running at once."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.running = 0
        self.most = 0
        self.sizes: list[int] = []

    async def __call__(self, feed: Arrays) -> Arrays:
        self.sizes.append(feed["x"].shape[0])
        self.running += 1
        self.most = max(self.most, self.running)
        await self.open.wait()
        self.running -= 1
        return {"y": feed["x"]}


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0)  # yield to the batcher's tasks until the state is reached


def test_up_to_max_concurrent_batches_run_at_once() -> None:
    model = Gate()

    async def main() -> None:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=1, max_batch_time=0, max_concurrent=2))
        tasks = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(5)]
        await until(lambda: model.running == 2)
        for _ in range(20):  # give a third batch every chance to start
            await asyncio.sleep(0)
        assert model.running == 2
        model.open.set()
        await asyncio.gather(*tasks)
        await batcher.close()

    run(main())
    assert model.most == 2
    assert model.sizes == [1] * 5


def test_while_every_slot_is_busy_the_backlog_forms_the_next_batch() -> None:
    model = Gate()

    async def main() -> None:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=8, max_batch_time=0, max_concurrent=1))
        first = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)
        backlog = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(3)]
        await until(
            lambda: next(iter(batcher._queues.values())).qsize() == 3
        )  # all three wait behind the running batch
        model.open.set()
        await asyncio.gather(first, *backlog)
        await batcher.close()

    run(main())
    assert model.sizes == [1, 3]  # the three that queued meanwhile ran as one batch


def test_length_buckets_take_turns_on_the_models_slots() -> None:
    """A front process runs one batch of a model at a time, whatever its length: buckets running side by side would
    only share its cores, with smaller batches each (text over 5 buckets on 2 cores: 15% more CPU a request)."""
    model = Gate()

    async def main() -> None:
        batcher = AdaptiveBatcher(
            model, BatchPolicy(max_batch_size=8, max_batch_time=0), stacking=Stacking(buckets=[4, 8], pad_inputs=["x"])
        )
        short = asyncio.create_task(batcher.predict({"x": np.ones((1, 3))}))
        await until(lambda: model.running == 1)
        longer = [asyncio.create_task(batcher.predict({"x": np.ones((1, 7))})) for _ in range(3)]
        for _ in range(20):  # give the other bucket every chance to start a batch of its own
            await asyncio.sleep(0)
        assert model.running == 1
        model.open.set()
        await asyncio.gather(short, *longer)
        await batcher.close()

    run(main())
    assert model.most == 1
    assert model.sizes == [1, 3]  # the longer ones queued meanwhile, and ran as one batch


def test_under_a_token_budget_the_oldest_goes_first_with_the_lengths_nearest_it() -> None:
    """Every length in one queue: a batch takes the oldest request, then those nearest its length while its padded
    tokens (longest x rows) stay within the budget and mostly real; the rest wait, the oldest of them first."""
    seen: list[np.ndarray] = []
    gate = Gate()

    async def model(feed: Arrays) -> Arrays:
        seen.append(feed["x"])
        if len(seen) == 1:
            await gate.open.wait()  # the first batch holds the model while the others queue
        return {"y": feed["x"].sum(axis=1)}

    async def main() -> list[float]:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=8, max_batch_time=0),
            stacking=Stacking(
                buckets=[8, 16, 32], pad_inputs=["x"], pad_to_bucket=False, budget=TokenBudget(tokens=40)
            ),
        )
        lengths = (10, 3, 30, 4, 28, 5, 6, 7)
        first = asyncio.create_task(batcher.predict({"x": np.ones((1, lengths[0]))}))
        await until(lambda: len(seen) == 1)
        rest = [asyncio.create_task(batcher.predict({"x": np.ones((1, n))})) for n in lengths[1:]]
        await until(lambda: next(iter(batcher._queues.values())).qsize() == len(rest))  # one queue for all
        gate.open.set()
        results = await asyncio.gather(first, *rest)
        await batcher.close()
        return [float(r[0]["y"][0]) for r in results]

    assert run(main()) == [10, 3, 30, 4, 28, 5, 6, 7]  # each request its own answer, padding masked out
    # 3 is the oldest: 4 and 5 join it; 6 would leave less than MIN_FILL of the batch real (18 of 24 tokens). 30
    # next, and 28 cannot join it (30 x 2 > 40 tokens); then 28, older than 6 and 7, which go last, together.
    assert [x.shape for x in seen] == [(1, 10), (3, 5), (1, 30), (1, 28), (2, 7)]


def test_under_an_attention_budget_long_requests_share_a_batch_with_fewer_than_short_ones() -> None:
    """rows x longest squared bounds a batch: two requests of 30 fit 1,800, a third does not, where six of 5 do."""
    seen: list[np.ndarray] = []
    gate = Gate()

    async def model(feed: Arrays) -> Arrays:
        seen.append(feed["x"])
        if len(seen) == 1:
            await gate.open.wait()
        return {"y": feed["x"].sum(axis=1)}

    async def main() -> None:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=8, max_batch_time=0),
            stacking=Stacking(pad_inputs=["x"], pad_to_bucket=False, budget=TokenBudget(attention=1800)),
        )
        first = asyncio.create_task(batcher.predict({"x": np.ones((1, 10))}))
        await until(lambda: len(seen) == 1)
        lengths = (30, 30, 30, 5, 5, 5, 5, 5, 5)
        rest = [asyncio.create_task(batcher.predict({"x": np.ones((1, n))})) for n in lengths]
        await until(lambda: next(iter(batcher._queues.values())).qsize() == len(rest))
        gate.open.set()
        results = await asyncio.gather(first, *rest)
        await batcher.close()
        assert [float(r[0]["y"][0]) for r in results] == [10, *lengths]

    run(main())
    assert [x.shape for x in seen] == [(1, 10), (2, 30), (1, 30), (6, 5)]


@pytest.mark.parametrize("budget", ["max_batch_tokens", "max_batch_attention"])
def test_a_token_budget_needs_padded_inputs(budget: str) -> None:
    from fnserve.core.models.manifest.models import ModelSettings

    with pytest.raises(ValueError, match=f"{budget} needs pad_inputs"):
        ModelSettings(name="m", path="m.onnx", sha256="0" * 64, max_batch_time_ms=2, **{budget: 512})


def test_a_request_whose_caller_went_away_is_not_computed() -> None:
    gate = asyncio.Event()
    batches: list[Arrays] = []

    async def model(feed: Arrays) -> Arrays:
        batches.append(feed)
        await gate.wait()
        return {"y": feed["x"] * 2}

    async def main() -> tuple[Arrays, bool]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=8, max_batch_time=0))
        first = asyncio.create_task(batcher.predict({"x": np.full((1, 1), 1.0)}))
        while not batches:  # the first batch is running: the next requests queue behind it
            await asyncio.sleep(0)
        gone = asyncio.create_task(batcher.predict({"x": np.full((1, 1), 2.0)}))
        kept = asyncio.create_task(batcher.predict({"x": np.full((1, 1), 3.0)}))
        while next(iter(batcher._queues.values())).qsize() < 2:
            await asyncio.sleep(0)
        gone.cancel()  # its deadline passed, say
        gate.set()
        await first
        out, _ = await kept
        await batcher.close()
        return out, gone.cancelled()

    out, cancelled = run(main())
    assert cancelled
    np.testing.assert_array_equal(out["y"], [[6.0]])
    assert [b["x"].ravel().tolist() for b in batches] == [[1.0], [3.0]]  # 2.0 never ran


def test_requests_of_other_shapes_never_share_a_batch_without_buckets() -> None:
    """Variable-length inputs with no length_buckets: each shape batches with its own kind, and none fails."""
    seen: list[tuple[int, ...]] = []

    async def model(feed: Arrays) -> Arrays:
        seen.append(feed["x"].shape)
        return {"y": feed["x"].sum(axis=1)}

    async def main() -> list[tuple[Arrays, float]]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=100, max_batch_time=0.05))
        lengths = [3, 11, 3, 4, 11, 3]
        results = await asyncio.gather(*(batcher.predict({"x": np.ones((1, n))}) for n in lengths))
        await batcher.close()
        return results

    results = run(main())
    assert sorted(seen) == [(1, 4), (2, 11), (3, 3)]
    assert [float(r[0]["y"][0]) for r in results] == [3, 11, 3, 4, 11, 3]


def test_a_shapes_queue_is_dropped_when_idle(monkeypatch: Any) -> None:
    import fnserve.core.batching.scheduler as batching

    monkeypatch.setattr(batching, "IDLE_SECONDS", 0.01)

    async def main() -> None:
        batcher = AdaptiveBatcher(Recorder(), BatchPolicy(max_batch_size=4, max_batch_time=0.0))
        await batcher.predict({"x": np.ones((1, 3))})
        assert len(batcher._queues) == 1
        task = next(iter(batcher._tasks.values()))
        await task  # it ends on its own once idle
        assert not batcher._queues and not batcher._tasks
        out, _ = await batcher.predict({"x": np.ones((1, 3))})  # the shape comes back: a new queue
        np.testing.assert_array_equal(out["y"], np.full((1, 3), 2.0))
        await batcher.close()

    run(main())


def test_past_max_queue_a_request_is_refused_at_once_and_the_queued_ones_still_run() -> None:
    model = Gate()
    reasons: list[str] = []

    async def main() -> list[Any]:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=8, max_batch_time=0, max_queue=2, name="digits"),
            observers=shed_to(reasons),
        )
        running = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)  # the slot is busy: what comes next queues
        queued = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(2)]
        await until(lambda: batcher.queued() == 2)
        refused = await asyncio.gather(
            *(batcher.predict({"x": np.ones((1, 1))}) for _ in range(3)), return_exceptions=True
        )
        assert model.running == 1  # refused while the batch still ran: at once, not after waiting
        model.open.set()
        answered = await asyncio.gather(running, *queued)
        await batcher.close()
        return [*refused, *answered]

    *refused, first, second, third = run(main())
    for error in refused:
        assert isinstance(error, Overloaded) and error.status_code == 503 and error.retry_after == 1
        assert "model 'digits' is overloaded: 2 rows wait already, 2 at most (max_queue_size)" in error.message
    assert grpc_code(Overloaded.status_code) == "UNAVAILABLE"
    assert all(isinstance(r, tuple) for r in (first, second, third))
    assert model.sizes == [1, 2] and reasons == ["queue_full"] * 3


def test_a_request_past_its_queue_deadline_is_refused_and_never_run() -> None:
    model = Gate()
    reasons: list[str] = []

    async def main() -> list[Any]:
        batcher = AdaptiveBatcher(
            model, BatchPolicy(max_batch_size=8, max_batch_time=0, max_queue_delay=0.05), observers=shed_to(reasons)
        )
        running = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)
        late = await asyncio.gather(
            *(batcher.predict({"x": np.full((1, 1), 2.0)}) for _ in range(3)), return_exceptions=True
        )
        model.open.set()  # the slot frees only after their deadline: nothing of theirs may run
        await running
        after = await batcher.predict({"x": np.ones((1, 1))})  # a later request is served as ever
        await batcher.close()
        return [*late, after]

    *late, after = run(main())
    assert all(isinstance(e, Overloaded) and "waited 50 ms (max_queue_delay_ms)" in e.message for e in late), late
    assert model.sizes == [1, 1]  # the first and the later one: the three late ones never ran
    assert reasons == ["queue_deadline"] * 3 and isinstance(after, tuple)


def test_the_queue_deadline_does_not_apply_once_a_batch_runs_the_request() -> None:
    model = Recorder(delay=0.1)  # a run longer than the deadline

    async def main() -> tuple[Arrays, float]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=8, max_batch_time=0, max_queue_delay=0.02))
        result = await batcher.predict({"x": np.ones((1, 1))})
        await batcher.close()
        return result

    out, _ = run(main())
    np.testing.assert_array_equal(out["y"], [[2.0]])


def test_a_batch_just_answered_does_not_count_as_waiting() -> None:
    """Between a batch's answers and its callers resuming, a request that arrives must not find the batch's rows
    counted as waiting (with max_queue_size near a batch's size, it would be refused for nothing)."""
    seen: list[int] = []

    async def main() -> None:
        async def model(feed: Arrays) -> Arrays:
            # Runs after the batch is answered and before its callers resume, as a request arriving then would.
            asyncio.get_running_loop().call_soon(lambda: seen.append(batcher.queued()))
            return {"y": feed["x"]}

        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=8, max_batch_time=0.05, max_queue=2))
        await asyncio.gather(*(batcher.predict({"x": np.ones((1, 1))}) for _ in range(2)))
        await batcher.close()

    run(main())
    assert seen == [0]


def test_the_pace_is_fitted_to_the_latest_runs() -> None:
    """A fixed cost and a cost a row, from runs of several sizes; while they were of one size, a cost a row up to
    it and their time past it (how the time grows is not known yet: a guess must not refuse a request)."""
    pace = Pace()
    assert pace.seconds(8) == 0.0  # nothing run yet: nothing foreseen
    pace.add(4, 0.04)
    assert pace.seconds(2) == pytest.approx(0.02)  # one size seen: 10 ms a row up to it
    assert pace.seconds(64) == pytest.approx(0.04)  # and no more past it, not 0.64 s
    for rows in (1, 16, 4, 8, 2, 16, 1) * 2:
        pace.add(rows, 0.005 + 0.002 * rows)  # 5 ms a run and 2 ms a row
    assert pace.seconds(16) == pytest.approx(0.005 + 0.032, rel=0.05)
    assert pace.seconds(1) < 0.01  # not the one-size pace of the first run


def test_a_batcher_keeps_the_pace_of_its_runs() -> None:
    async def main() -> float:
        batcher = AdaptiveBatcher(Recorder(delay=0.06), BatchPolicy(max_batch_size=8, max_batch_time=0))
        await batcher.predict({"x": np.ones((3, 1))})  # 60 ms (at least) for 3 rows
        await batcher.close()
        return batcher.admission.pace.seconds(3)

    assert 0.06 <= run(main()) < 0.5


def test_a_request_whose_wait_is_foreseen_past_its_deadline_is_refused_as_it_arrives() -> None:
    """At 0.4 s a row, batches of 2 and a 0.9 s queue deadline, behind a running row: a request with one row queued
    ahead joins the next batch (about 0.2 s: half the running one) and is taken; with two ahead it would wait for
    theirs too (about 1 s) and is refused at once, never run, instead of after waiting 0.9 s."""
    model = Gate()
    reasons: list[str] = []

    async def main() -> list[Any]:
        batcher = AdaptiveBatcher(
            model,
            BatchPolicy(max_batch_size=2, max_batch_time=0, max_queue_delay=0.9, name="minilm"),
            observers=shed_to(reasons),
        )
        batcher.admission.pace.add(2, 0.8)  # as the latest runs measured it: full batches, 0.4 s a row
        running = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)
        queued = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(2)]
        await until(lambda: batcher.queued() == 2)
        t0 = time.perf_counter()
        with pytest.raises(Overloaded) as refused:
            await batcher.predict({"x": np.ones((1, 1))})
        assert time.perf_counter() - t0 < 0.5 and model.running == 1  # at once, the batch still running
        model.open.set()
        answered = await asyncio.gather(running, *queued)
        await batcher.close()
        return [refused.value, *answered]

    refused, *answered = run(main())
    assert "the 2 rows ahead would keep it waiting about 1000 ms, past its queue deadline of 900 ms" in refused.message
    assert refused.status_code == 503 and reasons == ["queue_wait"]
    assert len(answered) == 3 and model.sizes == [1, 2]


def test_requests_still_being_read_count_against_the_queue_until_theirs_is_read() -> None:
    """Behind a running batch, four 256-row requests being read fill a 1,024-row queue: a fifth is refused from its
    headers, so that a burst of large bodies is not all read and decoded to be refused after; once read, a request
    is judged by the rows queued alone (the ones still being read came after it)."""
    model = Gate()

    async def main() -> AdaptiveBatcher:
        batcher = AdaptiveBatcher(
            model, BatchPolicy(max_batch_size=1024, max_batch_time=0, max_queue=1024, name="digits")
        )
        running = asyncio.create_task(batcher.predict({"x": np.ones((256, 1))}))
        await until(lambda: model.running == 1)
        batcher.admission.request_rows = 256.0  # what requests brought lately
        batcher.admission.arriving = 3
        batcher.admission.admit()  # 768 rows coming: room for one more
        batcher.admission.arriving = 4
        with pytest.raises(Overloaded, match="1024 rows wait already, 1024 at most"):
            batcher.admission.admit()
        batcher.admission.admit(256, read=True)  # a request read already: nothing queued ahead of it
        model.open.set()
        await running
        await batcher.close()
        return batcher

    assert run(main()).admission.shed == 1


def test_an_admitted_request_counts_as_arriving_in_its_scope_and_a_refused_one_not_at_all() -> None:
    """``admitted`` is the scope a request's body is read in: it counts as coming to the queue until the scope ends,
    however it ends; a refused request raises before its scope, and counts nothing."""
    batcher = AdaptiveBatcher(Recorder(), BatchPolicy(max_batch_size=4, max_batch_time=0, max_queue=4, name="digits"))
    with batcher.admitted(), batcher.admitted():
        assert batcher.admission.arriving == 2
    assert batcher.admission.arriving == 0
    with pytest.raises(ConnectionError), batcher.admitted():
        raise ConnectionError("its body never came")
    assert batcher.admission.arriving == 0
    with contextlib.ExitStack() as reading:
        for _ in range(8):  # a batch taken at once, and a queue of 4 rows, all being read
            reading.enter_context(batcher.admitted())
        with pytest.raises(Overloaded, match="8 rows wait already, 4 at most"):
            batcher.admitted()
        assert batcher.admission.arriving == 8 and batcher.admission.shed == 1
    assert batcher.admission.arriving == 0


def test_rows_an_idle_model_takes_at_once_do_not_count_as_waiting() -> None:
    """With no batch running, the first batch's rows go as soon as it forms: four 256-row requests being read
    leave room for four more in the queue of one 1,024-row batch (a flood on another model slows the reading of an
    idle one's requests: they must not be refused for it), and a ninth is refused."""
    batcher = AdaptiveBatcher(
        Recorder(), BatchPolicy(max_batch_size=1024, max_batch_time=0, max_queue=1024, name="digits")
    )
    batcher.admission.request_rows = 256.0
    assert batcher.free_rows() == 1024
    batcher.admission.arriving = 4
    batcher.admission.admit()
    batcher.admission.arriving = 7
    batcher.admission.admit()
    batcher.admission.arriving = 8
    with pytest.raises(Overloaded, match="2048 rows wait already, 1024 at most"):
        batcher.admission.admit()
    assert batcher.admission.shed == 1


def test_a_batch_runs_where_its_thread_cannot_be_niced(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    """A sandbox may forbid setpriority: the batch still runs (at the process's priority), and says why."""
    import os
    import threading

    from fnserve.core.batching import priority as _niced

    def forbidden(*_: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", forbidden)
    monkeypatch.setattr(_niced, "_POOLS", {})  # a new pool, whose thread tries
    ran = asyncio.run(_niced.run_niced(7, lambda: (threading.get_native_id(), "ran")))
    assert ran[1] == "ran" and ran[0] != threading.get_native_id()
    assert "cannot lower a model thread's priority (nice +7)" in caplog.text


def test_niced_runs_are_not_capped_below_asyncios_own_threads() -> None:
    """Batches on pool workers each hold a thread while they wait: five at once on one level all run together (a
    pool of four threads held the fifth back until one finished)."""
    import threading

    from fnserve.core.batching import priority as _niced

    together = threading.Barrier(5, timeout=10)  # asyncio's own pool has at least 5 threads (1 CPU + 4)

    async def main() -> list[int]:
        return await asyncio.gather(*(_niced.run_niced(3, together.wait) for _ in range(5)))

    assert sorted(asyncio.run(main())) == [0, 1, 2, 3, 4]


def test_a_batch_holds_its_slot_and_rows_from_when_it_forms_until_its_answers_are_set() -> None:
    """A request that arrives as a batch's answers are set (its callers' answers encoded and sent in that turn)
    sees the batch's slot free: the two rows waiting go at once, and it waits for that one batch alone. It was
    refused while the finished batch's task awaited its done-callback, the next batch's rows all waiting and no
    batch running (MiniLM in a closed loop of 14 clients: 60 refusals a second at a queue of one 8-row batch).
    Likewise a batch's rows run from when it forms, not from its task's first step a turn later: they were
    counted as waiting in between, beside a slot counted as taken."""
    model = Gate()

    async def main() -> list[Overloaded | None]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=2, max_batch_time=0, max_queue=2, name="m"))
        seen: list[Overloaded | None] = []
        execute = batcher._execute
        waiting_as_batches_began: list[int] = []

        async def began(*args: Any) -> None:
            waiting_as_batches_began.append(batcher.queued())  # the task's first step
            await execute(*args)

        batcher._execute = began  # type: ignore[method-assign]

        async def caller() -> None:
            await batcher.predict({"x": np.ones((1, 1))})
            seen.append(batcher.admission.refusal())  # in the turn its answer came back

        first = [asyncio.create_task(caller()) for _ in range(2)]
        await until(lambda: model.running == 1)
        waiting = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(2)]
        await until(lambda: batcher.queued() == 2)
        full = batcher.admission.refusal()  # behind the running batch, a queue of one batch is full
        model.open.set()
        await asyncio.gather(*first, *waiting)
        await batcher.close()
        assert waiting_as_batches_began == [0, 0]
        return [full, *seen]

    full, *seen = run(main())
    assert full is not None and "2 rows wait already, 2 at most" in full.message
    assert seen == [None, None]


def test_a_request_foreseen_to_be_answered_past_its_callers_deadline_is_refused_as_it_arrives() -> None:
    """At 0.4 s a row, batches of 2, behind a running row and one queued: a request joins the next batch, taken in
    about 0.2 s (half the running one) and answered 0.8 s later. Its caller's deadline of 0.5 s refuses it at once,
    never run; one of 2 s, or none, lets it in, and it is answered."""
    model = Gate()
    reasons: list[str] = []

    async def main() -> tuple[Overloaded, list[Any]]:
        batcher = AdaptiveBatcher(
            model, BatchPolicy(max_batch_size=2, max_batch_time=0, name="minilm"), observers=shed_to(reasons)
        )
        batcher.admission.pace.add(2, 0.8)
        running = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)
        queued = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: batcher.queued() == 1)
        with pytest.raises(Overloaded) as refused:
            await batcher.predict({"x": np.ones((1, 1))}, within=0.5)
        assert batcher.admission.refusal(within=0.5) is not None  # the same from its headers, before its body
        patient = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}, within=2.0))
        await until(lambda: batcher.queued() == 2)
        model.open.set()
        answered = await asyncio.gather(running, queued, patient)
        await batcher.close()
        return refused.value, answered

    refused, answered = run(main())
    assert "the 1 rows ahead would answer it in about 1000 ms, past its deadline of 500 ms" in refused.message
    assert refused.status_code == 503 and reasons == ["queue_wait", "queue_wait"]
    assert len(answered) == 3 and model.sizes == [1, 2]


def test_by_default_the_queue_holds_what_is_answered_in_time_however_many_rows() -> None:
    """No count bound and the default queue deadline (1 s) at 10 ms a batch of 2: behind a running row, ten
    requests queue (five batches, well within the deadline) and none is refused, as a closed loop of clients at
    several times a batch keeps its queue; each is answered."""
    model = Gate()

    async def main() -> list[Any]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=2, max_batch_time=0))
        batcher.admission.pace.add(2, 0.01)
        assert (batcher.policy.max_queue, batcher.admission.queue_delay()) == (None, 1.0)
        running = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)
        queued = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(10)]
        await until(lambda: batcher.queued() == 10)
        assert batcher.admission.refusal() is None and batcher.admission.shed == 0
        model.open.set()
        answered = await asyncio.gather(running, *queued)
        await batcher.close()
        return answered

    assert len(run(main())) == 11 and model.sizes == [1, 2, 2, 2, 2, 2]


def test_by_default_a_slow_models_queue_of_one_batch_is_not_refused_on_time() -> None:
    """A model whose full batch of 2 takes 1 s: by default its queue deadline is twice that (a second would refuse
    whatever waits behind a batch). Behind a running row, a request with a batch ahead of it (about 1.25 s) is let
    in; one with two batches ahead (about 2.25 s) is refused."""
    model = Gate()

    async def main() -> tuple[Overloaded | None, Overloaded | None, list[Any]]:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=2, max_batch_time=0, name="slow"))
        batcher.admission.pace.add(2, 1.0)
        assert batcher.admission.queue_delay() == 2.0
        running = asyncio.create_task(batcher.predict({"x": np.ones((1, 1))}))
        await until(lambda: model.running == 1)
        queued = [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(2)]
        await until(lambda: batcher.queued() == 2)
        one_batch_ahead = batcher.admission.refusal()
        queued += [asyncio.create_task(batcher.predict({"x": np.ones((1, 1))})) for _ in range(2)]
        await until(lambda: batcher.queued() == 4)
        two_batches_ahead = batcher.admission.refusal()
        model.open.set()
        answered = await asyncio.gather(running, *queued)
        await batcher.close()
        return one_batch_ahead, two_batches_ahead, answered

    one_batch_ahead, two_batches_ahead, answered = run(main())
    assert one_batch_ahead is None and len(answered) == 5
    assert two_batches_ahead is not None
    assert "the 4 rows ahead would keep it waiting about 2250 ms, past its queue deadline of 2000 ms" in (
        two_batches_ahead.message
    )


def test_a_batch_counts_its_requests_rows_not_its_batch_bucket_s_padding() -> None:
    """A GPU's batch padded up to its batch bucket runs the bucket's rows, but tells its observers (the batch size
    metric) the rows its requests hold."""
    model = Recorder()
    sizes: list[int] = []

    async def main() -> None:
        stacking = Stacking(batch_buckets=[8])
        observers = BatchObservers(on_batch=sizes.append)
        batcher = AdaptiveBatcher(
            model, BatchPolicy(max_batch_size=8, max_batch_time=0.05), stacking=stacking, observers=observers
        )
        await asyncio.gather(*(batcher.predict({"x": np.ones((1, 1))}) for _ in range(3)))
        await batcher.close()

    run(main())
    assert [len(feed["x"]) for feed in model.batches] == [8] * len(sizes)  # padded to the bucket
    assert sum(sizes) == 3
