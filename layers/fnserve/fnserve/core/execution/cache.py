"""ResultCache: results keyed by model, version, requested outputs and canonical input bytes.

Two tiers: an in-process LRU bounded in bytes, then an optional shared backend (DynamoDB in
Lambda). A backend failure of any kind is logged, counted and read as a miss: the cache can
slow an inference down by at most its backend's call budget, never fail it. A
:class:`CircuitBreaker` stops asking a backend that keeps failing (stalled or down) for a
while, so an outage costs a few requests one budget each, not every request.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fnserve.core.codec.tensors import pack_arrays, unpack_arrays
from fnserve.core.execution.embeddings import Prompted
from fnserve.core.models.datatypes import Arrays

logger = logging.getLogger(__name__)


def cache_key(
    model: str, version: str, inputs: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str] | None
) -> str:
    """A stable hex key from what determines a result, never from request ids or raw JSON."""
    h = hashlib.sha256()
    h.update(f"{model}\0{version}\0{','.join(outputs) if outputs else '*'}\0".encode())
    for name in sorted(inputs):
        array = inputs[name]
        h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype.kind == "O":
            for item in array.ravel():
                if isinstance(item, tuple):  # token ids, not text: a length no text has keeps them apart
                    h.update(b"\xff\xff\xff\xff")
                    data = np.asarray(item, dtype=np.int64).tobytes()
                else:
                    if type(item) is Prompted:  # its prompt named, never the default put before it
                        h.update(b"\xfe\xff\xff\xff")
                    data = item if isinstance(item, bytes) else str(item).encode()
                h.update(len(data).to_bytes(4, "little"))
                h.update(data)
        else:
            h.update(np.ascontiguousarray(array).data)
    return h.hexdigest()


class CacheBackend(Protocol):
    """The shared tier: blobs by key, with a time to live."""

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, float]]:
        """The live (unexpired) entries among ``keys``, with their expiry (epoch seconds)."""
        ...

    def put_many(self, entries: Mapping[str, bytes], ttl_seconds: int) -> None:
        """Store entries; expired after ``ttl_seconds``."""
        ...


@dataclass
class CacheStats:
    local_hits: int = 0
    remote_hits: int = 0
    misses: int = 0
    errors: int = 0
    skipped: int = 0  # backend calls not made: the breaker was open


class CircuitBreaker:
    """Closed (calls go through) until ``failures`` calls in a row fail; then open (no calls) for
    ``cooldown`` seconds; then half-open: one trial call closes it again, or reopens it.

    Logs once when it opens and once when it closes, not once per call.
    """

    def __init__(
        self, name: str, failures: int = 3, cooldown: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self._failed = 0
        self._open_until: float | None = None
        self._trial = False
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        """Whether calls are being refused."""
        return self._open_until is not None

    def allow(self) -> bool:
        """Whether a call may be made now (after its cooldown, one trial call at a time)."""
        if self._open_until is None:
            return True
        with self._lock:
            if self._open_until is None:
                return True
            if self._trial or self._clock() < self._open_until:
                return False
            self._trial = True
            return True

    def succeeded(self) -> None:
        self._failed = 0
        if self._open_until is not None:
            with self._lock:
                self._open_until, self._trial = None, False
            logger.warning("%s answers again; using it again", self.name)

    def failed(self) -> None:
        with self._lock:
            self._failed += 1
            if self._open_until is None and self._failed < self.failures:
                return
            reopened = self._open_until is not None
            self._open_until, self._trial = self._clock() + self.cooldown, False
        if not reopened:
            logger.warning(
                "%s failed %d times in a row; not asking it for %.0f s at a time until it answers",
                self.name,
                self.failures,
                self.cooldown,
            )


class ResultCache:
    """In-process LRU (bounded in bytes) in front of an optional backend, guarded by a breaker."""

    def __init__(
        self,
        max_bytes: int = 64 * 1024 * 1024,
        backend: CacheBackend | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.backend = backend
        self.breaker = breaker or CircuitBreaker("result cache backend")
        self.stats = CacheStats()
        self.by_model: dict[str, CacheStats] = {}  # the same lookups, by the model (or pipeline) they were for
        self._entries: OrderedDict[str, tuple[float, Arrays, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def remote(self) -> bool:
        """Whether lookups may leave the process (a blocking call: keep it off event loops)."""
        return self.backend is not None

    def get_many(self, keys: Sequence[str], model: str | None = None) -> dict[str, Arrays]:
        """Hits among ``keys``: the local tier first, the backend for the rest; counted for ``model`` too."""
        if model is None:
            return self._get_many(keys, None)
        stats = self.by_model.get(model)
        if stats is None:
            stats = self.by_model[model] = CacheStats()
        return self._get_many(keys, stats)

    def _get_many(self, keys: Sequence[str], stats: CacheStats | None) -> dict[str, Arrays]:
        found: dict[str, Arrays] = {}
        now = time.time()
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                if entry[0] <= now:
                    self._drop(key)
                    continue
                self._entries.move_to_end(key)
                found[key] = entry[1]
        local = len(found)
        remote_hits = 0
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing and self.backend is not None:
            remote = self._backend_get(missing)
            remote_hits = len(remote)
            found.update(remote)
        misses = len(set(keys) - set(found))
        for counted in (self.stats, stats) if stats is not None else (self.stats,):
            counted.local_hits += local
            counted.remote_hits += remote_hits
            counted.misses += misses
        return found

    def put_many(self, results: Mapping[str, Arrays], ttl_seconds: int) -> None:
        """Store results in both tiers; a backend failure is logged, never raised."""
        if not results:
            return
        expires = time.time() + ttl_seconds
        for key, arrays in results.items():
            self._put_local(key, arrays, expires)
        if self.backend is not None and self._allowed():
            try:
                self.backend.put_many({k: pack_arrays(v) for k, v in results.items()}, ttl_seconds)
            except Exception:
                self._failed("write failed; results are not shared")
            else:
                self.breaker.succeeded()

    def _backend_get(self, keys: list[str]) -> dict[str, Arrays]:
        assert self.backend is not None
        if not self._allowed():
            return {}
        try:
            entries = self.backend.get_many(keys)
            results = {key: (unpack_arrays(blob), expires) for key, (blob, expires) in entries.items()}
        except Exception:
            self._failed("read failed; treated as a miss")
            return {}
        self.breaker.succeeded()
        for key, (arrays, expires) in results.items():
            self._put_local(key, arrays, expires)
        return {key: arrays for key, (arrays, _) in results.items()}

    def _allowed(self) -> bool:
        if self.breaker.allow():
            return True
        self.stats.skipped += 1
        return False

    def _failed(self, what: str) -> None:
        self.stats.errors += 1
        # The first failures say why; once the breaker is open, the breaker's own line says it.
        logger.warning("result cache: backend %s", what, exc_info=not self.breaker.open)
        self.breaker.failed()

    def _put_local(self, key: str, arrays: Arrays, expires: float) -> None:
        for array in arrays.values():
            array.setflags(write=False)  # shared by every later hit
        size = sum(a.nbytes for a in arrays.values()) + 64 * len(arrays)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (expires, arrays, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        _, _, size = self._entries.pop(key)
        self._bytes -= size
