"""Garbage-collector settings for long-running processes (the server and its inference workers)."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Exempt everything built so far (modules, models, the app) from garbage collection.

    It lives as long as the process; left in the collector's oldest generation, every full
    collection walks all of it again, tens of milliseconds that land on some request's
    latency (the p99 under load: docs/design/server-layout.md).
    """
    gc.collect()
    gc.freeze()
