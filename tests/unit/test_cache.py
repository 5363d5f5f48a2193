from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from fnserve.core.codec.tensors import pack_arrays, unpack_arrays
from fnserve.core.execution import cache as cache_module
from fnserve.core.execution.cache import CircuitBreaker, ResultCache, cache_key
from tests.helpers import MemoryBackend, sample_arrays


def test_keys_depend_on_model_version_outputs_and_input_bytes_only() -> None:
    x = {"input": np.arange(6, dtype=np.float32).reshape(2, 3)}
    key = cache_key("m", "1", x, None)
    assert key == cache_key("m", "1", {"input": x["input"].copy()}, None)
    assert key != cache_key("m", "2", x, None)
    assert key != cache_key("n", "1", x, None)
    assert key != cache_key("m", "1", x, ["label"])
    assert key != cache_key("m", "1", {"input": x["input"].reshape(3, 2)}, None)
    assert key != cache_key("m", "1", {"input": x["input"].astype(np.float64)}, None)
    assert key != cache_key("m", "1", {"other": x["input"]}, None)
    strings = {"s": np.array([b"ab", b"c"], dtype=object)}
    assert cache_key("m", "1", strings, None) != cache_key("m", "1", {"s": np.array([b"a", b"bc"], dtype=object)}, None)


def test_packed_arrays_round_trip_every_datatype() -> None:
    arrays = sample_arrays()
    back = unpack_arrays(pack_arrays(arrays))
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        assert back[name].tolist() == array.tolist()


def test_local_tier_is_bounded_in_bytes_and_least_recently_used_goes_first() -> None:
    cache = ResultCache(max_bytes=3 * (800 + 64))
    for key in "abc":
        cache.put_many({key: {"y": np.zeros(100)}}, 60)
    cache.get_many(["a"])  # a is now the most recently used
    cache.put_many({"d": {"y": np.zeros(100)}}, 60)
    assert sorted(cache.get_many(list("abcd"))) == ["a", "c", "d"]
    cache.put_many({"huge": {"y": np.zeros(10_000)}}, 60)  # bigger than the whole tier: not kept
    assert cache.get_many(["huge"]) == {}


def test_expired_local_entries_are_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ResultCache()
    now = [1000.0]
    monkeypatch.setattr(cache_module.time, "time", lambda: now[0])
    cache.put_many({"k": {"y": np.ones(1)}}, ttl_seconds=10)
    assert list(cache.get_many(["k"])) == ["k"]
    now[0] = 1011.0
    assert cache.get_many(["k"]) == {}


def test_backend_hits_fill_the_local_tier_and_are_counted() -> None:
    backend = MemoryBackend()
    ResultCache(backend=backend).put_many({"k": {"y": np.arange(3)}}, 60)
    fresh = ResultCache(backend=backend)
    np.testing.assert_array_equal(fresh.get_many(["k", "missing"])["k"]["y"], np.arange(3))
    assert (fresh.stats.remote_hits, fresh.stats.misses) == (1, 1)
    fresh.get_many(["k"])
    assert fresh.stats.local_hits == 1 and backend.gets == 1


def test_cached_arrays_are_read_only() -> None:
    cache = ResultCache()
    cache.put_many({"k": {"y": np.ones(2)}}, 60)
    with pytest.raises(ValueError, match="read-only"):
        cache.get_many(["k"])["k"]["y"][0] = 5


class DeadBackend(MemoryBackend):
    """A shared tier that fails every call until revived."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = True
        self.calls = 0

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, float]]:
        self.calls += 1
        if self.dead:
            raise TimeoutError("stalled")
        return super().get_many(keys)

    def put_many(self, entries: Mapping[str, bytes], ttl_seconds: int) -> None:
        self.calls += 1
        if self.dead:
            raise TimeoutError("stalled")
        super().put_many(entries, ttl_seconds)


def test_a_failing_backend_is_left_alone_for_the_cooldown_then_tried_once() -> None:
    now = [0.0]
    backend = DeadBackend()
    cache = ResultCache(
        backend=backend, breaker=CircuitBreaker("backend", failures=3, cooldown=10, clock=lambda: now[0])
    )
    for n in range(10):
        assert cache.get_many([f"k{n}"]) == {}  # a miss, never an error
    assert backend.calls == 3 and cache.stats.errors == 3 and cache.stats.skipped == 7
    now[0] = 10.0  # cooldown over: one trial call, which fails and reopens it
    cache.get_many(["a"])
    cache.get_many(["b"])
    assert backend.calls == 4 and cache.breaker.open
    backend.dead = False
    now[0] = 20.0
    cache.put_many({"k": {"y": np.ones(1)}}, 60)  # the trial call succeeds: closed again
    assert not cache.breaker.open and backend.entries
    assert list(ResultCache(backend=backend).get_many(["k"])) == ["k"]


def test_the_breaker_counts_failures_in_a_row_only() -> None:
    breaker = CircuitBreaker("b", failures=3, cooldown=10, clock=lambda: 0.0)
    for _ in range(5):
        breaker.failed()
        breaker.failed()
        breaker.succeeded()
    assert not breaker.open and breaker.allow()
    for _ in range(3):
        breaker.failed()
    assert breaker.open and not breaker.allow()


def test_one_trial_call_at_a_time_while_half_open() -> None:
    now = [0.0]
    breaker = CircuitBreaker("b", failures=1, cooldown=5, clock=lambda: now[0])
    breaker.failed()
    now[0] = 5.0
    assert breaker.allow() and not breaker.allow()  # the second caller waits for the first's outcome
    breaker.succeeded()
    assert breaker.allow() and breaker.allow()
