"""The worker pool with real spawned processes: warm globals, errors, deaths, timeouts."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from fnserve.core.errors import HandlerError, InvocationTimeout, WorkerDied
from fnserve.workers.pool import FunctionSpec, WorkerPool
from tests.servers import wait_for

APP = """
import os, time
from fnserve.core.errors import InvalidInput

LOADED_AT = time.time()  # a warm global: built once per worker
CALLS = 0


def handler(event, context):
    global CALLS
    CALLS += 1
    action = event.get("action")
    if action == "sleep":
        if "marker" in event:
            open(event["marker"], "w").close()  # tells the test the handler is running
        time.sleep(event["seconds"])
    if action == "wait":  # until the test says so
        open(event["marker"], "w").close()
        while not os.path.exists(event["until"]):
            time.sleep(0.005)
    if action == "raise":
        raise RuntimeError("boom")
    if action == "invalid":
        raise InvalidInput("bad tensor")
    if action == "exit":
        os._exit(3)
    return {"pid": os.getpid(), "loaded_at": LOADED_AT, "calls": CALLS, "request_id": context.aws_request_id,
            "remaining_ms": context.get_remaining_time_in_millis(), "env": os.environ.get("GREETING")}
"""


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    (tmp_path / "app.py").write_text(APP)
    spec = FunctionSpec(name="echo", code_dir=str(tmp_path), env={"GREETING": "hi"}, timeout=2.0)
    pool = WorkerPool(spec, workers=2).start()
    yield pool
    pool.close()


def test_workers_keep_their_warm_globals_and_see_their_environment(pool: WorkerPool) -> None:
    first = [pool.invoke({}).result(timeout=10) for _ in range(6)]
    assert {r["env"] for r in first} == {"hi"}
    assert {r["pid"] for r in first} <= set(pool.worker_pids())
    for pid in {r["pid"] for r in first}:
        loaded = {r["loaded_at"] for r in first if r["pid"] == pid}
        assert len(loaded) == 1  # imported once per worker, not per invocation
    assert all(0 < r["remaining_ms"] <= 2000 for r in first)
    assert len({r["request_id"] for r in first}) == 6


def test_handler_errors_come_back_as_data(pool: WorkerPool) -> None:
    with pytest.raises(HandlerError, match="RuntimeError: boom") as info:
        pool.invoke({"action": "raise"}).result(timeout=10)
    assert info.value.status_code == 502
    with pytest.raises(Exception, match="bad tensor") as invalid:
        pool.invoke({"action": "invalid"}).result(timeout=10)
    assert type(invalid.value).__name__ == "InvalidInput" and invalid.value.status_code == 422  # type: ignore[attr-defined]
    assert pool.invoke({}).result(timeout=10)["env"] == "hi"


def test_a_dying_worker_fails_only_its_invocation_and_is_replaced(pool: WorkerPool) -> None:
    with pytest.raises(WorkerDied, match="exit 3"):
        pool.invoke({"action": "exit"}).result(timeout=10)
    wait_for(lambda: pool.respawns == 1, 30, "the worker to be replaced")
    results = [pool.invoke({}).result(timeout=30) for _ in range(4)]
    assert all(r["env"] == "hi" for r in results)


def test_a_worker_killed_from_outside_mid_invocation(pool: WorkerPool, tmp_path: Path) -> None:
    marker = tmp_path / "running"
    busy = pool.invoke({"action": "sleep", "seconds": 1.5, "marker": str(marker)})
    wait_for(marker.exists, 10, "the handler to be running")
    for pid in pool.worker_pids():
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDied):
        busy.result(timeout=10)
    assert pool.invoke({}).result(timeout=60)["env"] == "hi"


def test_an_invocation_past_the_timeout_is_answered_and_its_worker_replaced(pool: WorkerPool) -> None:
    # The handler would sleep 300 s; an answer within 60 s (a generous guard, not a speed) can only be the
    # pool's own 2 s timeout.
    with pytest.raises(InvocationTimeout, match="timed out after 2s") as info:
        pool.invoke({"action": "sleep", "seconds": 300}).result(timeout=60)
    assert info.value.status_code == 504
    assert pool.invoke({}).result(timeout=60)["env"] == "hi"


def test_more_invocations_than_workers_queue_and_all_complete(pool: WorkerPool) -> None:
    futures = [pool.invoke({"action": "sleep", "seconds": 0.05}) for _ in range(10)]
    results = [f.result(timeout=30) for f in futures]
    assert len({r["request_id"] for r in results}) == 10
    assert len({r["pid"] for r in results}) == 2  # both containers took work


def test_close_leaves_no_process_behind(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    pool = WorkerPool(FunctionSpec(name="echo", code_dir=str(tmp_path)), workers=2).start()
    pids = pool.worker_pids()
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(WorkerDied, match="shutting down"):
        pool.invoke({}).result(timeout=1)


FRAGILE = """
import os

if os.path.exists(os.environ["BROKEN_IF"]):
    raise RuntimeError("the model store is unreachable")


def handler(event, context):
    if event.get("action") == "exit":
        os._exit(3)
    return os.getpid()
"""


def test_a_function_that_cannot_start_fails_start_with_its_init_error(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(FRAGILE)
    (tmp_path / "broken").touch()
    spec = FunctionSpec(name="fragile", code_dir=str(tmp_path), env={"BROKEN_IF": str(tmp_path / "broken")})
    with pytest.raises(HandlerError, match="fragile cannot start: .*the model store is unreachable"):
        WorkerPool(spec, workers=2).start(wait_ready=60)
    assert not [p for p in multiprocessing.active_children() if p.name == "fnserve-fragile"]


def test_a_recycle_after_a_worker_broke_while_starting_keeps_the_pool_dispatching(tmp_path: Path) -> None:
    """A worker that failed its init is forgotten when it exits; a recycle (fnserve local --reload, after the code
    is fixed) then retires it too. Forgetting it twice killed the dispatcher thread, and every later invocation
    waited forever (seen under load in the emulator's reload test)."""
    (tmp_path / "app.py").write_text(FRAGILE)
    broken = tmp_path / "broken"
    spec = FunctionSpec(name="fragile", code_dir=str(tmp_path), env={"BROKEN_IF": str(broken)}, timeout=10)
    pool = WorkerPool(spec, workers=1).start()
    try:
        broken.touch()
        with pytest.raises(WorkerDied):
            pool.invoke({"action": "exit"}).result(timeout=10)
        with pytest.raises(HandlerError, match="cannot start"):
            pool.invoke({}).result(timeout=60)  # its replacement broke while starting
        broken.unlink()
        pool.recycle()
        assert isinstance(pool.invoke({}).result(timeout=60), int)
        assert pool.recycles == 1
    finally:
        pool.close()


def test_an_init_error_is_the_answer_until_a_later_invocation_starts_cleanly(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(FRAGILE)
    broken = tmp_path / "broken"
    spec = FunctionSpec(name="fragile", code_dir=str(tmp_path), env={"BROKEN_IF": str(broken)}, timeout=10)
    pool = WorkerPool(spec, workers=1).start()
    try:
        broken.touch()  # from now on a new worker cannot start
        with pytest.raises(WorkerDied):
            pool.invoke({"action": "exit"}).result(timeout=10)
        with pytest.raises(HandlerError, match="cannot start: .*the model store is unreachable"):
            pool.invoke({}).result(timeout=60)
        broken.unlink()  # fixed: the next invocation starts a worker again, and it serves
        assert isinstance(pool.invoke({}).result(timeout=60), int)
    finally:
        pool.close()


def test_a_pool_given_attempts_starts_a_broken_worker_again_at_once_then_gives_up(tmp_path: Path) -> None:
    """A server's pool: a replacement that cannot start is retried without waiting for an invocation, and after
    ``attempts`` in a row the pool tells its owner (who stops the server) instead of retrying for ever."""
    (tmp_path / "app.py").write_text(FRAGILE)
    broken = tmp_path / "broken"
    spec = FunctionSpec(name="fragile", code_dir=str(tmp_path), env={"BROKEN_IF": str(broken)}, timeout=10)
    given_up: list[HandlerError] = []
    pool = WorkerPool(spec, workers=1, attempts=2, on_give_up=given_up.append).start()
    try:
        broken.touch()  # from now on a new worker cannot start
        with pytest.raises(WorkerDied):
            pool.invoke({"action": "exit"}).result(timeout=10)
        wait_for(lambda: bool(given_up), 60, "the pool to give up")
        [error] = given_up
        assert re.fullmatch(
            r"function fragile cannot start: .*the model store is unreachable \(2 times in a row\)", error.message
        )
        assert (pool.start_failures, pool.respawns) == (2, 2)  # the replacement, and one more try
        broken.unlink()
        with pytest.raises(HandlerError) as raised:  # given up: not started again, even once it could start
            pool.invoke({}).result(timeout=10)
        assert raised.value.message == error.message and pool.respawns == 2
    finally:
        pool.close()


def test_while_every_worker_is_busy_a_higher_priority_goes_first(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    pool = WorkerPool(FunctionSpec(name="echo", code_dir=str(tmp_path), timeout=30.0), workers=1).start()
    try:
        marker, until = tmp_path / "running", tmp_path / "go"
        busy = pool.invoke({"action": "wait", "marker": str(marker), "until": str(until)})
        wait_for(marker.exists, 30, "the worker to be busy")
        low = [pool.invoke({}) for _ in range(2)]
        high = pool.invoke({}, priority=5)
        until.touch()
        order = {name: f.result(timeout=30)["calls"] for name, f in (("busy", busy), ("high", high))}
        lows = sorted(f.result(timeout=30)["calls"] for f in low)
    finally:
        pool.close()
    assert order == {"busy": 1, "high": 2} and lows == [3, 4]  # queued last, it ran first; the lows in order
