"""A request's deadline against what its texts are foreseen to cost, the runs a budget cuts a batch into, and the
batcher taking a request of its own before the runs of one cut into many."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from fnserve.adapters.handler import API_GATEWAY_SECONDS, INVOCATION_RESERVE_SECONDS, invocation_deadline
from fnserve.aws.events import LambdaContext, http_api_event, sqs_event
from fnserve.core.batching.scheduler import AdaptiveBatcher, BatchPolicy
from fnserve.core.errors import grpc_code
from fnserve.core.execution import servable
from fnserve.core.execution.deadline import (
    A_REQUEST,
    DEADLINE,
    Foresight,
    RequestTooLong,
    TokenPace,
    TooManyTokens,
    within,
)
from fnserve.core.execution.embeddings import TokenBudget
from fnserve.core.execution.service import InferenceService
from tests.helpers import DEMO_MANIFEST


def paced(per_token: float) -> TokenPace:
    pace = TokenPace()
    pace.add(1000, 1000 * per_token)
    return pace


def test_a_request_its_deadline_cannot_fit_is_refused_before_its_first_run() -> None:
    token = DEADLINE.set(within(2.0, "API Gateway's 29 s"))
    try:
        Foresight(1000, paced(0.001)).check()  # 1 s foreseen, 2 s left
        Foresight(1000, paced(0.001), parallel=2).check()
        with pytest.raises(RequestTooLong, match=r"past its deadline \(API Gateway's 29 s") as refused:
            Foresight(4000, paced(0.001)).check()  # 4 s foreseen
        assert refused.value.status_code == 413 and grpc_code(413) == "RESOURCE_EXHAUSTED"
        assert refused.value.code == "request_too_long" and "fnserve submit" in refused.value.message
        Foresight(4000, TokenPace()).check()  # no pace yet: its own runs tell
    finally:
        DEADLINE.reset(token)
    Foresight(10**9, paced(1.0)).check()  # no deadline: nothing to refuse against


def test_after_an_eighth_of_its_tokens_a_request_is_foreseen_by_its_own_pace() -> None:
    token = DEADLINE.set(within(0.5, "the request's timeout"))
    try:
        foresight = Foresight(800, paced(1e-6))  # the model's pace says 1 ms for all of it
        foresight.ran(50)  # its first run: untimed, it pays what a new length costs once
        foresight.check()
        time.sleep(0.05)  # its second run's time (the work, not a wait for a race): 50 tokens, 1 ms a token
        foresight.ran(50)
        with pytest.raises(RequestTooLong, match="after 100 of them ran"):
            foresight.check()  # 700 tokens left at its own 1 ms a token: 0.7 s, past the 0.45 s left
    finally:
        DEADLINE.reset(token)


def test_the_soonest_deadline_wins() -> None:
    token = DEADLINE.set(within(1.0, "the function's remaining time"))
    try:
        assert within(10.0, "the server's request timeout").why == "the function's remaining time"
        assert within(0.5, "the request's timeout").why == "the request's timeout"
    finally:
        DEADLINE.reset(token)


def test_an_invocation_s_deadline_is_its_remaining_time_or_api_gateway_s() -> None:
    long = LambdaContext(timeout=120.0)
    event = http_api_event("POST", "/v1/embeddings", route_key="ANY /v1/{proxy+}", headers={}, body=b"{}")
    gateway = invocation_deadline(event, long)
    assert gateway is not None and gateway.why.startswith("API Gateway")
    assert gateway.left() == pytest.approx(API_GATEWAY_SECONDS, abs=0.5)
    queued = invocation_deadline(sqs_event([]), long)
    assert queued is not None and queued.why == "the function's remaining time"
    assert queued.left() == pytest.approx(120.0 - INVOCATION_RESERVE_SECONDS, abs=0.5)
    short = invocation_deadline(event, LambdaContext(timeout=10.0))
    assert short is not None and short.why == "the function's remaining time"
    assert invocation_deadline({}, SimpleNamespace()) is None  # a context that does not say


def test_a_budget_says_how_many_rows_of_a_length_a_run_holds() -> None:
    budget = TokenBudget(tokens=1024, attention=32768)
    assert budget.rows(64, 16) == 64  # short texts: max_batch_size bounds them
    assert budget.rows(64, 64) == 8  # 32768 / 64²
    assert budget.rows(64, 256) == 1  # a text longer than the budget still runs, alone
    assert TokenBudget(tokens=1000).rows(64, 100) == 10


def order_of_runs(latest: float) -> list[str]:
    """The order a batcher of one row a batch runs an ingest's four runs (each to start by ``latest``) and a query
    that comes while the first runs."""
    order: list[str] = []

    async def model(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        order.append(str(int(feed["x"][0, 0])))
        await asyncio.sleep(0.01)  # the model's run time, not a wait for a race
        return {"y": feed["x"]}

    async def main() -> None:
        batcher = AdaptiveBatcher(model, BatchPolicy(max_batch_size=1, max_batch_time=0.0))
        runs = [{"x": np.full((1, 1), 100 + i)} for i in range(4)]
        ingest = [
            asyncio.ensure_future(batcher.predict(run, bulk=True, admitted=i > 0, latest=latest))
            for i, run in enumerate(runs)
        ]
        while not order:  # the ingest's first run has started: the rest wait
            await asyncio.sleep(0)
        query = asyncio.ensure_future(batcher.predict({"x": np.full((1, 1), 1)}))
        await asyncio.gather(*ingest, query)
        await batcher.close()

    asyncio.run(main())
    return order


def test_a_request_of_its_own_goes_before_the_runs_of_one_cut_into_many() -> None:
    assert order_of_runs(float("inf")) == ["100", "1", "101", "102", "103"]


def test_a_run_that_must_start_for_its_deadline_goes_before_a_request_of_its_own() -> None:
    # Each run had to start by now: its request's deadline leaves it no room to wait.
    assert order_of_runs(time.monotonic()) == ["100", "101", "102", "103", "1"]


def test_a_request_s_runs_must_start_by_what_its_deadline_leaves() -> None:
    assert Foresight(1000, paced(0.001)).latest_start() == float("inf")  # no deadline: never urgent
    token = DEADLINE.set(within(10.0, "the request's timeout"))
    try:
        latest = Foresight(1000, paced(0.001)).latest_start()  # 1 s of work, 10 s left: start within 9 s
        assert latest - time.monotonic() == pytest.approx(9.0, abs=0.2)
    finally:
        DEADLINE.reset(token)


def test_a_request_is_bound_by_its_tokens_and_deadline_and_a_batch_of_jobs_by_neither(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = InferenceService.from_manifest(DEMO_MANIFEST)
    texts = {"text": np.array([b"a short text", b"another short text, a little longer"], dtype=object)}
    monkeypatch.setattr(servable, "MAX_REQUEST_TOKENS", 10)  # these two hold 14
    with pytest.raises(TooManyTokens, match="holds 14 tokens, more than the 10"):
        service.predict("minilm-embed", texts)
    jobs = A_REQUEST.set(False)  # as the job processor runs a batch: a request's bound is not a batch's
    try:
        assert service.predict("minilm-embed", texts)["embedding"].shape == (2, 384)
    finally:
        A_REQUEST.reset(jobs)
    monkeypatch.undo()
    service.servable("minilm-embed").pace.add(1, 10.0)  # ten seconds a token: no deadline of a second fits
    token = DEADLINE.set(within(1.0, "the function's remaining time"))
    try:
        with pytest.raises(RequestTooLong, match="past its deadline"):
            service.predict("minilm-embed", texts)
        jobs = A_REQUEST.set(False)  # as the job processor runs a batch: sliced by its own time instead
        try:
            assert service.predict("minilm-embed", texts)["embedding"].shape == (2, 384)
        finally:
            A_REQUEST.reset(jobs)
    finally:
        DEADLINE.reset(token)
