"""Stored results: the typed record, its key rules, and the store protocol every backend implements.

One table (or keyspace) holds two kinds of entries: job results under ``job#<job id>``
(batch jobs and cascade follow-ups, read back by id) and the result cache's shared tier under
``cache#<content hash>``. A backend (``fnserve.stores.dynamodb`` for DynamoDB) is the only
translator between a :class:`ResultRecord` and its service's items.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple, Protocol

from fnserve.core.codec.tensors import pack_arrays, unpack_arrays
from fnserve.core.models.datatypes import Arrays

Status = Literal["done", "failed"]


def job_key(job_id: str) -> str:
    """The key of a job's result."""
    return f"job#{job_id}"


def job_keys(job_ids: Iterable[str]) -> list[str]:
    """:func:`job_key` of each id (a batch has 10,000)."""
    return [f"job#{job_id}" for job_id in job_ids]


def cache_entry_key(key: str) -> str:
    """The key of a cached result in the shared tier (``key`` is its content hash)."""
    return f"cache#{key}"


class ResultRecord(NamedTuple):
    """A job's stored outcome: its outputs (packed) when done, the reason when failed.

    Immutable and typed; a NamedTuple rather than a frozen dataclass because a batch makes one
    per job, and a frozen dataclass costs several times as much to build (docs/design/jobs.md).
    """

    key: str
    status: Status
    model: str
    version: str | None
    created: int
    expires: int
    payload: bytes | None = None  # the outputs, packed by fnserve.core.codec.tensors.pack_arrays
    error: str | None = None
    # The model that computed the outputs where it is not ``model``, the name the job called (a pipeline's model,
    # a cascade's fast or slow one); ``version`` is that model's.
    answered_by: str | None = None

    @classmethod
    def done(
        cls, key: str, model: str, version: str, outputs: Arrays, *, now: int, ttl: int, answered_by: str | None = None
    ) -> ResultRecord:
        return cls.done_many([key], model, [(version, pack_arrays(outputs), answered_by)], now=now, ttl=ttl)[0]

    @classmethod
    def done_many(
        cls, keys: Sequence[str], model: str, jobs: Iterable[tuple[str, bytes, str | None]], *, now: int, ttl: int
    ) -> list[ResultRecord]:
        """The records of jobs that ran, each ``(version, payload, answered_by)`` (its outputs packed already), in one
        pass: a batch stores 10,000, and a call each would show in its time."""
        expires, new = now + ttl, tuple.__new__  # the tuple's own constructor: cheaper than the generated one
        return [
            new(cls, (key, "done", model, version, now, expires, payload, None, answered_by))
            for key, (version, payload, answered_by) in zip(keys, jobs, strict=True)
        ]

    @classmethod
    def failed(cls, key: str, model: str, error: str, *, now: int, ttl: int) -> ResultRecord:
        return cls(key, "failed", model, None, now, now + ttl, error=error)

    def outputs(self) -> Arrays:
        """The stored outputs (empty unless done)."""
        return unpack_arrays(self.payload) if self.payload is not None else {}


class ResultStore(Protocol):
    """Where job results live (DynamoDB in AWS)."""

    def get(self, keys: Iterable[str]) -> dict[str, ResultRecord]:
        """The unexpired records among ``keys``; missing keys are absent."""
        ...

    def put(self, records: Sequence[ResultRecord]) -> set[str]:
        """Store records (last write wins); returns the keys that could not be stored. Never raises."""
        ...
