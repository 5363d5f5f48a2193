"""The Redis result store: job results, follow-up results and the shared cache tier, one keyspace.

For Memorystore on Google Cloud, or beside the container server; chosen by URL
(``FNSERVE_RESULTS=redis://host:6379/0``, ``rediss://`` for TLS). The only translator between
:class:`~fnserve.core.jobs.results.ResultRecord` and Redis values.

- A record is one string value: a small JSON header, a newline, then the packed outputs. Its
  expiry is Redis's own (``SET ... EXAT``), so nothing expired is ever read back.
- Every read is ``MGET`` and every write one pipeline of ``SET``s, in slices of ``BATCH`` keys:
  a batch of 10,000 jobs is 10 round trips each way.
- A payload over ``MAX_INLINE_PAYLOAD`` goes to the results bucket (S3), the value holding its
  URI, and comes back from there when the record is read, as the DynamoDB store does.
- Reads raise :class:`StoreUnavailable` when Redis cannot be reached (a cache read is then a
  miss, a results lookup a 503); writes never raise and return the keys not stored.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from fnserve.core.errors import ConfigError, StoreUnavailable
from fnserve.core.jobs.results import ResultRecord, cache_entry_key

logger = logging.getLogger(__name__)

BATCH = 1000
# Redis takes values up to 512 MB; past a few MB one value stalls every other client of the server.
MAX_INLINE_PAYLOAD = 4 * 1024 * 1024
_EXPIRY = struct.Struct("<d")

PayloadSink = Callable[[str, bytes], str]  # (key, bytes) -> URI where they now are
PayloadSource = Callable[[str], bytes]  # URI -> bytes


def _encode(record: ResultRecord, payload_uri: str | None = None) -> bytes:
    header = {
        "status": record.status,
        "model": record.model,
        "version": record.version,
        "created": record.created,
        "expires": record.expires,
        "error": record.error,
        "payload_uri": payload_uri,
        "answered_by": record.answered_by,
    }
    body = record.payload if payload_uri is None and record.payload is not None else b""
    return orjson.dumps(header) + b"\n" + body


def _decode(key: str, value: bytes) -> tuple[ResultRecord, str | None]:
    head, _, body = value.partition(b"\n")
    header = orjson.loads(head)
    record = ResultRecord(
        key=key,
        status="done" if header["status"] == "done" else "failed",
        model=str(header["model"]),
        version=header["version"],
        created=int(header["created"]),
        expires=int(header["expires"]),
        payload=body if header["status"] == "done" and header["payload_uri"] is None else None,
        error=header["error"],
        answered_by=header.get("answered_by"),  # absent in records written before it was kept
    )
    return record, header["payload_uri"]


class RedisResultStore:
    """Batched reads and writes of result records over one Redis client (a connection pool).

    ``socket_timeout`` bounds every call: a process that answers requests gives its store the
    request budget, so a stalled Redis costs a request that long and no longer.
    """

    def __init__(
        self,
        client: Any,
        *,
        payload_sink: PayloadSink | None = None,
        payload_source: PayloadSource | None = None,
        where: str = "Redis",
    ) -> None:
        self.client = client
        self.payload_sink = payload_sink
        self.payload_source = payload_source
        self.where = where

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float | None = None,
        payload_sink: PayloadSink | None = None,
        payload_source: PayloadSource | None = None,
    ) -> RedisResultStore:
        """A store on ``redis://host:port/db`` (``rediss://`` with TLS, ``redis://:password@host``)."""
        import redis

        try:
            client = redis.Redis.from_url(
                url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout, health_check_interval=30
            )
        except ValueError as exc:
            raise ConfigError(f"results URL {url!r} is not a Redis URL: {exc}") from None
        where = url.split("@")[-1]  # never a password in a message
        return cls(client, payload_sink=payload_sink, payload_source=payload_source, where=f"Redis at {where}")

    # -- records -------------------------------------------------------------------------------

    def get(self, keys: Iterable[str]) -> dict[str, ResultRecord]:
        """The unexpired records among ``keys`` (payloads fetched back by reference); missing keys are absent."""
        found: dict[str, ResultRecord] = {}
        for key, value in self.read_values(keys).items():
            record, uri = _decode(key, value)
            if uri is not None:
                if self.payload_source is None:
                    raise StoreUnavailable(f"result {key} is stored at {uri}, and nothing here can read it")
                record = record._replace(payload=self.payload_source(uri))
            found[key] = record
        return found

    def put(self, records: Sequence[ResultRecord]) -> set[str]:
        """Write records (last write wins); returns the keys that could not be stored. Never raises."""
        failed: set[str] = set()
        values: dict[str, tuple[bytes, int]] = {}
        for record in records:
            encoded = self._offload(record)
            if encoded is None:
                failed.add(record.key)
            else:
                values[record.key] = (encoded, record.expires)
                failed.discard(record.key)
        return failed | self.write_values(values)

    def _offload(self, record: ResultRecord) -> bytes | None:
        payload = record.payload
        if payload is None or len(payload) <= MAX_INLINE_PAYLOAD:
            return _encode(record)
        if self.payload_sink is None:
            logger.error(
                "result %s is %d bytes, over the inline limit, and no results bucket is set", record.key, len(payload)
            )
            return None
        try:
            return _encode(record, self.payload_sink(record.key, payload))
        except Exception:
            logger.exception("result %s could not be written to the results bucket", record.key)
            return None

    # -- raw values (the cache tier's entries are not records) ----------------------------------

    def read_values(self, keys: Iterable[str]) -> dict[str, bytes]:
        """The values among ``keys``, ``MGET`` a slice of ``BATCH`` at a time; a fault is :class:`StoreUnavailable`."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, bytes] = {}
        for start in range(0, len(wanted), BATCH):
            chunk = wanted[start : start + BATCH]
            try:
                values = self.client.mget(chunk)
            except Exception as exc:  # redis.RedisError, or an OSError beneath it
                raise StoreUnavailable(f"reading results from {self.where}: {type(exc).__name__}: {exc}") from exc
            found.update((key, value) for key, value in zip(chunk, values, strict=True) if value is not None)
        return found

    def write_values(self, values: Mapping[str, tuple[bytes, int]]) -> set[str]:
        """Write ``key -> (value, expires at)``, one pipeline a slice; returns the keys not stored. Never raises."""
        failed: set[str] = set()
        now = int(time.time())
        items = [(key, value, expires) for key, (value, expires) in values.items() if expires > now]
        for start in range(0, len(items), BATCH):
            chunk = items[start : start + BATCH]
            try:
                pipe = self.client.pipeline(transaction=False)
                for key, value, expires in chunk:
                    pipe.set(key, value, exat=expires)
                replies = pipe.execute(raise_on_error=False)
            except Exception:
                logger.exception("writing %d results to %s failed", len(chunk), self.where)
                failed.update(key for key, _, _ in chunk)
                continue
            failed.update(key for (key, _, _), reply in zip(chunk, replies, strict=True) if reply is not True)
        if failed:
            logger.error("%d results could not be stored in %s: %s", len(failed), self.where, sorted(failed)[:10])
        return failed


class RedisCacheBackend:
    """The result cache's shared tier, as ``cache#<key>`` values (expiry, then the packed outputs)."""

    def __init__(self, store: RedisResultStore) -> None:
        self.store = store

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, float]]:
        by_entry = {cache_entry_key(k): k for k in keys}
        values = self.store.read_values(by_entry)
        return {
            by_entry[entry]: (value[_EXPIRY.size :], _EXPIRY.unpack_from(value)[0]) for entry, value in values.items()
        }

    def put_many(self, entries: Mapping[str, bytes], ttl_seconds: int) -> None:
        expires = int(time.time()) + ttl_seconds
        values = {cache_entry_key(k): (_EXPIRY.pack(expires) + v, expires) for k, v in entries.items()}
        failed = self.store.write_values(values)
        if failed:
            raise RuntimeError(f"{len(failed)} cache entries were not stored")
