"""AWS outages against the real moto server, played by a proxy that stalls or drops: nothing hangs, nothing is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from fnserve.aws import clients
from fnserve.server.app import server_app
from fnserve.settings import Settings
from tests.faults import FaultyProxy, faulty_proxy
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, write_test_manifest
from tests.helpers.clouds import Aws
from tests.servers import wait_for

DIGITS = np.load(DEMO_HOLDOUT)["input"]
SESSION = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))


@pytest.fixture
def proxy(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultyProxy]:
    """Every AWS call of fnserve goes through the proxy (the resources exist in moto already)."""
    with faulty_proxy(aws.url) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        clients.reset()
        yield proxy


def cached_settings(aws: Aws, tmp_path: Path, **overrides: Any) -> Settings:
    manifest = write_test_manifest(tmp_path, cache_ttl=3600)
    return Settings(
        manifest=manifest, results_table=aws.table, results_bucket=aws.bucket, access_log=False, **overrides
    )


def infer_body(row: int) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[row].tolist()}]}


async def call(app: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=60) as client:
        return await client.request(method, path, **kwargs)


def test_a_stalled_dynamodb_fails_no_inference_and_is_left_alone_until_it_answers(
    aws: Aws, proxy: FaultyProxy, tmp_path: Path
) -> None:
    # A cooldown longer than the 27 quick requests after the breaker opens take, even on a loaded
    # machine (at 0.2 s a slow run let one half-open probe through: 8 stalled calls, not 6).
    settings = cached_settings(aws, tmp_path, cache_breaker_cooldown_seconds=1.0)
    app = server_app(settings)
    cache = app.state.plane.service.cache
    proxy.set("stall")

    async def load(rows: Iterable[int]) -> list[httpx.Response]:
        return [await call(app, "POST", "/v2/models/digits-accurate/infer", json=infer_body(row)) for row in rows]

    responses = asyncio.run(load(range(30)))
    for row, response in enumerate(responses):
        assert response.status_code == 200, response.text
        label = next(o["data"] for o in response.json()["outputs"] if o["name"] == "label")
        assert label == SESSION.run(["label"], {"input": DIGITS[row : row + 1]})[0].tolist()
        assert response.headers["x-fnserve-cache"] == "miss"
    # Three failed calls (a read and a write of the first request, the second's read), two attempts
    # each; then the breaker holds every later request away from the stalled table.
    assert proxy.stalled_requests <= 3 * settings.request_store_attempts
    assert cache.breaker.open and cache.stats.skipped > 0

    proxy.set("forward")  # it answers again: after the cooldown, one call finds out and the cache is back
    rows = iter(range(40, len(DIGITS)))

    def shared_tier_back() -> bool:
        asyncio.run(load([next(rows)]))
        return not cache.breaker.open

    wait_for(shared_tier_back, 30, "the cache's shared tier to be used again")
    row = next(rows)
    asyncio.run(load([row]))
    fresh = server_app(settings)  # another process: an empty in-process tier
    again = asyncio.run(call(fresh, "POST", "/v2/models/digits-accurate/infer", json=infer_body(row)))
    assert again.headers["x-fnserve-cache"] == "hit"


def test_health_answers_while_a_request_waits_on_a_stalled_dynamodb(
    aws: Aws, proxy: FaultyProxy, tmp_path: Path
) -> None:
    # A long budget, so the stalled request is still waiting when health is asked.
    app = server_app(cached_settings(aws, tmp_path, request_store_timeout_seconds=30))
    proxy.set("stall")

    async def scenario() -> None:
        inference = asyncio.create_task(call(app, "POST", "/v2/models/digits-accurate/infer", json=infer_body(0)))
        assert await asyncio.to_thread(proxy.stalled.wait, 30), "the inference never reached DynamoDB"
        live = await call(app, "GET", "/v2/health/live")
        assert live.status_code == 200
        assert not inference.done()  # health did not wait for it: the event loop was free
        proxy.set("forward")  # the stalled connection drops; the retry reaches DynamoDB
        assert (await inference).status_code == 200

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", ["stall", "down"])
def test_results_are_a_503_with_retry_after_while_dynamodb_is_out(
    aws: Aws, proxy: FaultyProxy, tmp_path: Path, mode: Any
) -> None:
    app = server_app(cached_settings(aws, tmp_path))
    proxy.set(mode)
    response = asyncio.run(call(app, "GET", "/v2/results/job-1"))
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert "DynamoDB" in response.json()["error"] and "try again" in response.json()["error"]
    proxy.set("forward")
    assert asyncio.run(call(app, "GET", "/v2/results/job-1")).status_code == 404
