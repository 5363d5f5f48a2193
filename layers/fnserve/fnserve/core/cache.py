"""ResultCache: results keyed by model, version, requested outputs and canonical input bytes.

Two tiers: an in-process LRU bounded in bytes, then an optional shared backend (DynamoDB in
Lambda). A backend failure of any kind is logged, counted and read as a miss: the cache can
slow an inference down by at most its timeout, never fail it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fnserve.core.datatypes import Arrays
from fnserve.core.tensors import pack_arrays, unpack_arrays

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


class ResultCache:
    """In-process LRU (bounded in bytes) in front of an optional backend."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, backend: CacheBackend | None = None) -> None:
        self.max_bytes = max_bytes
        self.backend = backend
        self.stats = CacheStats()
        self._entries: OrderedDict[str, tuple[float, Arrays, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> dict[str, Arrays]:
        """Hits among ``keys``: the local tier first, the backend for the rest."""
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
        self.stats.local_hits += len(found)
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing and self.backend is not None:
            remote = self._backend_get(missing)
            self.stats.remote_hits += len(remote)
            found.update(remote)
        self.stats.misses += len(set(keys) - set(found))
        return found

    def put_many(self, results: Mapping[str, Arrays], ttl_seconds: int) -> None:
        """Store results in both tiers; a backend failure is logged, never raised."""
        if not results:
            return
        expires = time.time() + ttl_seconds
        for key, arrays in results.items():
            self._put_local(key, arrays, expires)
        if self.backend is not None:
            try:
                self.backend.put_many({k: pack_arrays(v) for k, v in results.items()}, ttl_seconds)
            except Exception:
                self.stats.errors += 1
                logger.warning("result cache: backend write failed; results are not shared", exc_info=True)

    def _backend_get(self, keys: list[str]) -> dict[str, Arrays]:
        assert self.backend is not None
        try:
            entries = self.backend.get_many(keys)
            results = {key: (unpack_arrays(blob), expires) for key, (blob, expires) in entries.items()}
        except Exception:
            self.stats.errors += 1
            logger.warning("result cache: backend read failed; treated as a miss", exc_info=True)
            return {}
        for key, (arrays, expires) in results.items():
            self._put_local(key, arrays, expires)
        return {key: arrays for key, (arrays, _) in results.items()}

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
