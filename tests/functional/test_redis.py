"""The Redis result store and cache tier against a real redis-server (Debian's), started here on a free port.

``make test`` installs redis-server with apt-get when it is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from fnserve import bootstrap
from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_.sqs import create_handler
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.core.errors import ConfigError, StoreUnavailable
from fnserve.core.jobs.messages import job_message
from fnserve.core.jobs.results import ResultRecord, job_key
from fnserve.settings import Settings
from fnserve.stores import redis as redis_store
from fnserve.stores.redis import RedisCacheBackend, RedisResultStore
from tests.helpers import DEMO_HOLDOUT, write_test_manifest
from tests.helpers.asgi import AsgiClient, Get
from tests.helpers.clouds import Aws
from tests.moto import free_port

DIGITS = np.load(DEMO_HOLDOUT)["input"]


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisResultStore]:
    store = RedisResultStore.from_url(redis_url)
    store.client.flushdb()
    yield store
    store.client.close()


def record(key: str, rows: slice = slice(0, 2), ttl: int = 3600) -> ResultRecord:
    return ResultRecord.done(key, "digits-accurate", "1", {"x": DIGITS[rows]}, now=int(time.time()), ttl=ttl)


def commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def test_records_round_trip_with_a_native_expiry(store: RedisResultStore) -> None:
    failed = ResultRecord.failed("job#b", "digits-accurate", "input 'x' is wrong", now=int(time.time()), ttl=60)
    assert store.put([record("job#a"), failed]) == set()
    got = store.get(["job#a", "job#b", "job#missing"])
    assert set(got) == {"job#a", "job#b"}
    np.testing.assert_array_equal(got["job#a"].outputs()["x"], DIGITS[:2])
    assert (got["job#b"].status, got["job#b"].error, got["job#b"].payload) == ("failed", "input 'x' is wrong", None)
    assert 3590 <= store.client.ttl("job#a") <= 3600 and 50 <= store.client.ttl("job#b") <= 60
    expired = record("job#old")._replace(expires=int(time.time()) - 1)
    assert store.put([expired]) == set() and store.get(["job#old"]) == {}  # already over: not written at all


def test_a_thousand_records_take_one_round_trip_each_way(store: RedisResultStore) -> None:
    store.client.config_resetstat()
    records = [record(job_key(f"j{i}"), slice(i % 300, i % 300 + 1)) for i in range(1000)]
    assert store.put(records) == set()
    got = store.get(r.key for r in records)
    assert len(got) == 1000
    calls = commands(store.client)
    assert calls.get("mget") == 1 and calls.get("set") == 1000  # one pipeline of 1,000 SETs: one round trip
    np.testing.assert_array_equal(got["job#j299"].outputs()["x"], DIGITS[299:300])


def test_a_large_result_goes_to_the_bucket_by_reference(
    redis_url: str, aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "MAX_INLINE_PAYLOAD", 1024)
    settings = Settings(results=redis_url, results_bucket=aws.bucket)
    store = bootstrap.result_store(settings)
    assert isinstance(store, RedisResultStore)
    big = record("job#big", slice(0, 100))  # 25 KB of pixels
    assert store.put([big]) == set()
    value = store.client.get("job#big")
    assert len(value) < 1024 and f"s3://{aws.bucket}/fnserve/results/job/big".encode() in value
    np.testing.assert_array_equal(store.get(["job#big"])["job#big"].outputs()["x"], DIGITS[:100])
    # Without a bucket a large result is not stored, and says so: the job is redelivered, not lost.
    alone = RedisResultStore.from_url(redis_url)
    assert alone.put([record("job#big2", slice(0, 100))]) == {"job#big2"}


def test_an_unreachable_redis_is_a_503_on_read_and_every_key_back_on_write() -> None:
    down = RedisResultStore.from_url(f"redis://:secret@127.0.0.1:{free_port()}/0", socket_timeout=0.2)
    with pytest.raises(StoreUnavailable, match=r"reading results from Redis at 127\.0\.0\.1:\d+/0") as raised:
        down.get(["job#a"])
    assert "secret" not in raised.value.message
    assert down.put([record("job#a"), record("job#b")]) == {"job#a", "job#b"}
    with pytest.raises(ConfigError, match="not both"):
        bootstrap.result_store(Settings(results="redis://x", results_table="t"))
    with pytest.raises(ConfigError, match="is not a Redis URL"):
        RedisResultStore.from_url("http://127.0.0.1/0")


def test_the_cache_tier_hits_across_processes_and_a_fault_is_a_miss(
    store: RedisResultStore, redis_url: str, tmp_path: Path
) -> None:
    backend = RedisCacheBackend(store)
    backend.put_many({"k1": b"packed"}, ttl_seconds=60)
    (value, expires) = backend.get_many(["k1", "k2"])["k1"]
    assert value == b"packed" and time.time() + 50 < expires <= time.time() + 60
    assert 50 <= store.client.ttl("cache#k1") <= 60
    settings = Settings(manifest=write_test_manifest(tmp_path, cache_ttl=3600), results=redis_url)
    body = {"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": DIGITS[:2].ravel().tolist()}]}
    first = AsgiClient(create_app(bootstrap.build_dataplane(settings), settings))
    assert first.post("/v2/models/digits-accurate/infer", json=body).headers["x-fnserve-cache"] == "miss"
    second = AsgiClient(create_app(bootstrap.build_dataplane(settings), settings))  # a new process: empty LRU
    assert second.post("/v2/models/digits-accurate/infer", json=body).headers["x-fnserve-cache"] == "hit"
    # Redis gone: the cache reads it as a miss, and inference answers all the same.
    gone = settings.replace(results=f"redis://127.0.0.1:{free_port()}/0")
    third = AsgiClient(create_app(bootstrap.build_dataplane(gone), gone))
    response = third.post("/v2/models/digits-accurate/infer", json=body)
    assert response.status_code == 200 and response.headers["x-fnserve-cache"] == "miss"


def test_batch_jobs_store_their_results_in_redis_and_the_api_reads_them(
    store: RedisResultStore, redis_url: str, tmp_path: Path
) -> None:
    settings = Settings(manifest=write_test_manifest(tmp_path), results=redis_url)
    handler = create_handler(settings=settings)
    rows = [DIGITS[i % len(DIGITS)][None] for i in range(1000)]
    bodies = [json.dumps(job_message(f"r{i}", "digits-accurate", {"input": row})) for i, row in enumerate(rows)]
    bodies.append(json.dumps({"id": "r-poison", "model": "digits-accurate", "inputs": "not tensors"}))
    store.client.config_resetstat()
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    calls = commands(store.client)
    assert calls.get("set") == 1001 and "mget" not in calls  # first deliveries: no read at all
    get = Get(AsgiClient(create_app(bootstrap.build_dataplane(settings), settings)))
    assert get("/v2/results/r7").json()["status"] == "done"
    poison = get("/v2/results/r-poison").json()
    assert poison["status"] == "failed" and "inputs" in poison["error"]
    # Redelivered: read once (one MGET for the 1,000), not recomputed, not written again.
    store.client.config_resetstat()
    again = sqs_event(bodies[:1000])
    for message in again["Records"]:
        message["attributes"]["ApproximateReceiveCount"] = "2"
    assert handler(again, LambdaContext()) == {"batchItemFailures": []}
    assert commands(store.client).get("mget") == 1 and "set" not in commands(store.client)
