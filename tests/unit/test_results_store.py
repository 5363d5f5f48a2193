"""The DynamoDB result store's batching and retries, with faults injected by botocore's Stubber."""

from __future__ import annotations

from typing import Any

import boto3
import numpy as np
import pytest
from botocore.stub import Stubber

from fnserve.core.execution.cache import ResultCache
from fnserve.stores.dynamodb import DynamoCacheBackend, DynamoResultStore, _to_dynamo

TABLE = "results"


@pytest.fixture
def dynamodb() -> Any:
    return boto3.client(
        "dynamodb",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        endpoint_url="http://stub",
    )


def store(dynamodb: Any, sleeps: list[float], attempts: int = 8) -> DynamoResultStore:
    return DynamoResultStore(TABLE, dynamodb=dynamodb, sleep=sleeps.append, max_attempts=attempts)


def put(pk: str) -> dict[str, Any]:
    return {"PutRequest": {"Item": _to_dynamo({"pk": pk, "status": "done", "expires_at": 4_000_000_000})}}


ITEMS = [{"pk": f"job#{i}", "status": "done", "expires_at": 4_000_000_000} for i in range(30)]


def test_writes_go_25_per_call_and_unprocessed_items_are_retried_with_backoff(dynamodb: Any) -> None:
    sleeps: list[float] = []
    with Stubber(dynamodb) as stub:
        first = [put(f"job#{i}") for i in range(25)]
        stub.add_response(
            "batch_write_item", {"UnprocessedItems": {TABLE: first[3:5]}}, {"RequestItems": {TABLE: first}}
        )
        stub.add_response("batch_write_item", {"UnprocessedItems": {}}, {"RequestItems": {TABLE: first[3:5]}})
        rest = [put(f"job#{i}") for i in range(25, 30)]
        stub.add_response("batch_write_item", {}, {"RequestItems": {TABLE: rest}})
        assert store(dynamodb, sleeps).write_items(ITEMS) == set()
        stub.assert_no_pending_responses()
    assert len(sleeps) == 1 and 0 <= sleeps[0] <= 0.05


def test_items_left_unprocessed_after_every_attempt_are_reported(dynamodb: Any) -> None:
    sleeps: list[float] = []
    batch = [put(f"job#{i}") for i in range(3)]
    with Stubber(dynamodb) as stub:
        stub.add_response("batch_write_item", {"UnprocessedItems": {TABLE: batch[1:]}})
        for _ in range(2):
            stub.add_response("batch_write_item", {"UnprocessedItems": {TABLE: batch[1:]}})
        assert store(dynamodb, sleeps, attempts=3).write_items(ITEMS[:3]) == {"job#1", "job#2"}
    assert len(sleeps) == 3
    assert sleeps[1] <= 0.1 and sleeps[2] <= 0.2  # exponential caps, full jitter below them


def test_a_failing_write_call_reports_its_items_and_never_raises(dynamodb: Any) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("batch_write_item", "ProvisionedThroughputExceededException")
        assert store(dynamodb, []).write_items(ITEMS[:2]) == {"job#0", "job#1"}


def test_reads_go_100_keys_per_call_and_unprocessed_keys_are_retried(dynamodb: Any) -> None:
    keys = [f"job#{i}" for i in range(120)]
    item = _to_dynamo({"pk": "job#7", "status": "done", "expires_at": 4_000_000_000})
    expired = _to_dynamo({"pk": "job#8", "status": "done", "expires_at": 1})
    sleeps: list[float] = []
    with Stubber(dynamodb) as stub:
        first = {TABLE: {"Keys": [{"pk": {"S": k}} for k in keys[:100]]}}
        unprocessed = {TABLE: {"Keys": [{"pk": {"S": "job#9"}}]}}
        stub.add_response(
            "batch_get_item",
            {"Responses": {TABLE: [item, expired]}, "UnprocessedKeys": unprocessed},
            {"RequestItems": first},
        )
        stub.add_response("batch_get_item", {"Responses": {TABLE: []}}, {"RequestItems": unprocessed})
        second = {TABLE: {"Keys": [{"pk": {"S": k}} for k in keys[100:]]}}
        stub.add_response("batch_get_item", {"Responses": {TABLE: []}}, {"RequestItems": second})
        found = store(dynamodb, sleeps).get(keys + keys[:5])  # duplicates asked once
        stub.assert_no_pending_responses()
    assert list(found) == ["job#7"]  # job#8 expired: DynamoDB deletes late, reads must not
    assert len(sleeps) == 1


def test_cache_treats_every_backend_fault_as_a_miss(dynamodb: Any) -> None:
    cache = ResultCache(backend=DynamoCacheBackend(store(dynamodb, [])))
    with Stubber(dynamodb) as stub:
        stub.add_client_error("batch_get_item", "ProvisionedThroughputExceededException")
        stub.add_client_error("batch_write_item", "InternalServerError")
        assert cache.get_many(["k"]) == {}
        cache.put_many({"k": {"y": np.ones(2)}}, ttl_seconds=60)
    assert cache.stats.errors == 2 and cache.stats.misses == 1
    assert list(cache.get_many(["k"])) == ["k"]  # the local tier still has it
