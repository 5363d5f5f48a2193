"""Threads the OS favours less: where a batch's runs go, below the event loop's thread, and a lower priority
model's lower still, in a process that runs several models.

On Linux a nice value is a thread's own (NPTL), and an unprivileged thread cannot take back a nice value once
raised, so each level has a pool of threads niced once, at start, and only that level's runs go there.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)
_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def _nice(level: int) -> None:
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + level)
    except OSError as exc:  # a sandbox that forbids it: the runs go on at the process's own priority
        logger.warning(f"cannot lower a model thread's priority (nice +{level}): {exc}")


async def run_niced(level: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a thread niced ``level`` above the process, with this task's context, as
    :func:`asyncio.to_thread` carries it (the device a run reports goes through it). Each level's pool has as
    many threads as asyncio's own (a batch on a pool worker holds one while it waits for the worker's answer)."""
    with _LOCK:
        pool = _POOLS.get(level)
        if pool is None:
            pool = _POOLS[level] = ThreadPoolExecutor(
                thread_name_prefix=f"fnserve-nice{level}", initializer=_nice, initargs=(level,)
            )
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(context.run, fn, *args))
