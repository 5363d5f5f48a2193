"""The DynamoDB result store: job results, follow-up results and the shared cache tier, one table.

The only translator between :class:`~fnserve.core.jobs.results.ResultRecord` and DynamoDB items.
Every read is a BatchGetItem (100 keys a call) and every write a BatchWriteItem (25 items a
call); unprocessed keys and items are retried with exponential backoff and full jitter.
Items carry a TTL attribute (``expires_at``); DynamoDB deletes late, so reads ignore
expired items. A payload too big for an item (400 KB) goes to S3, the item holding its URI
(``payload_s3``), and comes back from S3 when the record is read.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fnserve.aws.clients import DEFAULT_BUDGET, Budget, client, store_error
from fnserve.core.errors import StoreUnavailable
from fnserve.core.jobs.results import ResultRecord, cache_entry_key
from fnserve.stores import s3

logger = logging.getLogger(__name__)

KEY = "pk"
TTL_ATTRIBUTE = "expires_at"
GET_BATCH = 100
WRITE_BATCH = 25
# Leave room in the 400 KB item limit for the other attributes.
MAX_INLINE_PAYLOAD = 350 * 1024

Item = dict[str, Any]


def _to_dynamo(item: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in item.items():
        if value is None:
            continue
        if isinstance(value, bytes):
            out[name] = {"B": value}
        elif isinstance(value, bool):
            out[name] = {"BOOL": value}
        elif isinstance(value, int | float):
            out[name] = {"N": str(value)}
        else:
            out[name] = {"S": str(value)}
    return out


def _from_dynamo(item: Mapping[str, Any]) -> Item:
    out: Item = {}
    for name, typed in item.items():
        ((kind, value),) = typed.items()
        out[name] = float(value) if kind == "N" else bytes(value) if kind == "B" else value
    return out


def _item(record: ResultRecord) -> Item:
    return {
        KEY: record.key,
        "status": record.status,
        "model_name": record.model,
        "model_version": record.version,
        "payload": record.payload,
        "error": record.error,
        "created_at": record.created,
        TTL_ATTRIBUTE: record.expires,
        "answered_by": record.answered_by,
    }


def _record(item: Item) -> ResultRecord:
    return ResultRecord(
        key=item[KEY],
        status="done" if item.get("status") == "done" else "failed",
        model=str(item.get("model_name", "")),
        version=item.get("model_version"),
        created=int(item.get("created_at", 0)),
        expires=int(item[TTL_ATTRIBUTE]),
        payload=item.get("payload"),
        error=item.get("error"),
        answered_by=item.get("answered_by"),
    )


class DynamoResultStore:
    """Batched, retried reads and writes of result records, as items keyed by ``pk``.

    ``budget`` bounds each DynamoDB call (timeouts, attempts); ``max_attempts`` and the delays
    bound the retries of what a call leaves unprocessed. ``named``: errors name the table (a person's
    command line, ``fnserve results --table``; never a server's answers to its clients).
    """

    def __init__(
        self,
        table: str,
        *,
        bucket: str | None = None,
        dynamodb: Any = None,
        budget: Budget = DEFAULT_BUDGET,
        max_attempts: int = 8,
        base_delay: float = 0.05,
        max_delay: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        named: bool = False,
    ) -> None:
        self.table = table
        self._reading = f"reading results from DynamoDB table {table!r}" if named else "reading results from DynamoDB"
        self.bucket = bucket
        self._dynamodb = dynamodb
        self.budget = budget
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._sleep = sleep

    @property
    def dynamodb(self) -> Any:
        if self._dynamodb is None:
            self._dynamodb = client("dynamodb", self.budget)
        return self._dynamodb

    def _backoff(self, attempt: int) -> None:
        self._sleep(random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt)))

    def get(self, keys: Iterable[str]) -> dict[str, ResultRecord]:
        """Unexpired records among ``keys`` (payloads fetched back from S3); missing keys are absent."""
        return {key: _record(item) for key, item in self.read_items(keys).items()}

    def put(self, records: Sequence[ResultRecord]) -> set[str]:
        """Write records (last write wins); returns the keys that could not be stored. Never raises."""
        return self.write_items([_item(record) for record in records])

    def read_items(self, keys: Iterable[str]) -> dict[str, Item]:
        """The raw items among ``keys`` (for :class:`DynamoCacheBackend`, whose entries are not records)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, Item] = {}
        now = time.time()
        for start in range(0, len(wanted), GET_BATCH):
            request = {self.table: {"Keys": [{KEY: {"S": k}} for k in wanted[start : start + GET_BATCH]]}}
            for attempt in range(self.max_attempts):
                try:
                    response = self.dynamodb.batch_get_item(RequestItems=request)
                except Exception as exc:
                    raise store_error(exc, self._reading) from exc
                for raw in response.get("Responses", {}).get(self.table, []):
                    item = _from_dynamo(raw)
                    if item.get(TTL_ATTRIBUTE, float("inf")) > now:
                        found[item[KEY]] = item
                request = response.get("UnprocessedKeys") or {}
                if not request:
                    break
                self._backoff(attempt)
            else:
                raise StoreUnavailable(f"DynamoDB left keys unprocessed after {self.max_attempts} attempts")
        for item in found.values():
            if "payload_s3" in item:
                item["payload"] = s3.get_bytes(item.pop("payload_s3"))
        return found

    def write_items(self, items: Sequence[Item]) -> set[str]:
        """Write raw items; returns the keys that could not be stored.

        One item per key: BatchWriteItem refuses a call that names a key twice (a job sent
        twice can land in one batch), and would take the other items of the call down with it.
        """
        failed: set[str] = set()
        requests = []
        for item in {item[KEY]: item for item in items}.values():
            prepared = self._offload(item)
            if prepared is None:
                failed.add(item[KEY])
            else:
                requests.append({"PutRequest": {"Item": _to_dynamo(prepared)}})
        for start in range(0, len(requests), WRITE_BATCH):
            failed |= self._write(requests[start : start + WRITE_BATCH])
        return failed

    def _offload(self, item: Item) -> Item | None:
        payload = item.get("payload")
        if payload is None or len(payload) <= MAX_INLINE_PAYLOAD:
            return item
        if self.bucket is None:
            logger.error(
                "result %s is %d bytes, over the item limit, and no results bucket is set", item[KEY], len(payload)
            )
            return None
        try:
            uri = s3.put_bytes(self.bucket, f"fnserve/results/{item[KEY].replace('#', '/')}", payload)
        except Exception:
            logger.exception("result %s could not be written to S3", item[KEY])
            return None
        return {**{k: v for k, v in item.items() if k != "payload"}, "payload_s3": uri}

    def _write(self, batch: list[dict[str, Any]]) -> set[str]:
        pending = {self.table: batch}
        for attempt in range(self.max_attempts):
            try:
                response = self.dynamodb.batch_write_item(RequestItems=pending)
            except Exception:
                logger.exception("BatchWriteItem failed")
                break
            pending = response.get("UnprocessedItems") or {}
            if not pending:
                return set()
            self._backoff(attempt)
        left = pending.get(self.table, [])
        keys = {r["PutRequest"]["Item"][KEY]["S"] for r in left}
        logger.error("%d results could not be stored: %s", len(keys), sorted(keys)[:10])
        return keys


class DynamoCacheBackend:
    """The result cache's shared tier, as ``cache#<key>`` items in the result store's table."""

    def __init__(self, store: DynamoResultStore) -> None:
        self.store = store

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, float]]:
        by_item = {cache_entry_key(k): k for k in keys}
        items = self.store.read_items(by_item)
        return {by_item[pk]: (item["payload"], item[TTL_ATTRIBUTE]) for pk, item in items.items()}

    def put_many(self, entries: Mapping[str, bytes], ttl_seconds: int) -> None:
        expires = int(time.time()) + ttl_seconds
        items = [{KEY: cache_entry_key(k), "payload": v, TTL_ATTRIBUTE: expires} for k, v in entries.items()]
        failed = self.store.write_items(items)
        if failed:
            raise RuntimeError(f"{len(failed)} cache entries were not stored")
