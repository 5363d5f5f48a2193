"""Follow-up ids, and what a result id stands for when it is looked up.

Follow-up ids are minted by a cascade and signed (HMAC-SHA256), and say what they are: the
lookup can tell ``skipped`` and ``pending`` from an unknown id without anything stored first,
so the request path costs the fast model plus at most one queue send. Batch job ids are the
caller's own; their results are found in the store or not at all.

States of a lookup: ``done`` and ``failed`` (a record is stored), ``skipped`` (the fast answer
was final), ``pending`` (minted here, no result yet), ``expired`` (minted here, older than the
cascade keeps results), ``unknown`` (never minted here, nothing stored).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fnserve.core.jobs.results import ResultRecord, ResultStore, job_key
from fnserve.core.models.manifest.cascades import CascadeSettings

Status = Literal["pending", "skipped"]
State = Literal["done", "failed", "pending", "skipped", "expired", "unknown"]


@dataclass(frozen=True, slots=True)
class FollowupId:
    """What a follow-up id says about itself."""

    status: Status
    created: int
    cascade: str
    value: str


class FollowupIds:
    """Mints and checks signed follow-up ids: ``{p|s}-{created, base 36}-{nonce}-{cascade}-{signature}``.

    ``key``: the signing key, or a function giving the keys now (the current one first, then
    any previous one still accepted: a rotated secret's ids keep working until they expire).
    """

    def __init__(self, key: bytes | Callable[[], Sequence[bytes]]) -> None:
        self._keys: Callable[[], Sequence[bytes]] = key if callable(key) else (lambda: (key,))

    def mint(self, status: Status, cascade: str, now: float | None = None) -> str:
        created = int(time.time() if now is None else now)
        body = f"{status[0]}-{np.base_repr(created, 36).lower()}-{os.urandom(8).hex()}-{cascade}"
        return f"{body}-{_sign(self._keys()[0], body)}"

    def parse(self, value: str) -> FollowupId | None:
        """The id's claims, or None for anything this deployment did not mint."""
        body, _, signature = value.rpartition("-")
        if not body or not any(hmac.compare_digest(signature, _sign(key, body)) for key in self._keys()):
            return None
        kind, created, _, cascade = body.split("-", 3)
        status: Status = "pending" if kind == "p" else "skipped"
        return FollowupId(status, int(created, 36), cascade, value)


def _sign(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class ResultState:
    """What a result id stands for now; ``model`` is the model whose answer it is (or will be)."""

    id: str
    state: State
    model: str | None = None
    record: ResultRecord | None = None


class ResultLookup:
    """Result ids -> :class:`ResultState`, reading the store at most once per look."""

    def __init__(
        self,
        store: ResultStore,
        ids: FollowupIds | None = None,
        cascades: Mapping[str, CascadeSettings] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ids = ids
        self.cascades = dict(cascades or {})
        self._clock = clock

    def look(self, result_id: str) -> ResultState:
        """The id's state now (blocking: one store read, unless the id itself says skipped)."""
        claim = self.ids.parse(result_id) if self.ids is not None else None
        cascade = self.cascades.get(claim.cascade) if claim is not None else None
        if claim is not None and cascade is not None and claim.status == "skipped":
            return ResultState(result_id, "skipped", cascade.fast)
        key = job_key(result_id)
        record = self.store.get([key]).get(key)
        if record is not None:
            return ResultState(result_id, record.status, record.model, record)
        if claim is None or cascade is None:
            return ResultState(result_id, "unknown")
        if self._clock() - claim.created > cascade.result_ttl_seconds:
            return ResultState(result_id, "expired", cascade.slow)
        return ResultState(result_id, "pending", cascade.slow)

    async def wait(self, result_id: str, seconds: float) -> ResultState:
        """:meth:`look`, again while the result is pending, for at most ``seconds`` (a long poll).

        Reads back off (50 ms doubling to 1 s): a 20 s wait costs about 25 reads, not hundreds.
        """
        import asyncio  # here: the batch functions, which have no event loop, never import it

        deadline = time.monotonic() + seconds
        delay = 0.05
        while True:
            state = await asyncio.to_thread(self.look, result_id)
            remaining = deadline - time.monotonic()
            if state.state != "pending" or remaining <= 0:
                return state
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)
