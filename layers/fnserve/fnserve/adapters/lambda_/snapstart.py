"""Lambda SnapStart: what the snapshot should hold, and what must not be shared by its copies.

Before the snapshot, every model is loaded and run once (:meth:`ModelRegistry.warm_all`),
so that a restored copy's first request finds its sessions built and their allocators and
kernels warm instead of loading the model itself. After each restore, AWS clients (they
hold connections and credentials from snapshot time), random state (every copy would draw
the same numbers) and the request-id prefix are renewed. Models, sessions and the app are
kept: that is the point.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from fnserve.aws import clients
from fnserve.observability import request_meta

if TYPE_CHECKING:
    from fnserve.core.models.registry import ModelRegistry


def register(registry: ModelRegistry) -> None:
    """Register the hooks with the runtime, where SnapStart is on (a no-op elsewhere)."""
    try:
        from snapshot_restore_py import (
            register_after_restore,
            register_before_snapshot,
        )
    except ImportError:
        return
    register_before_snapshot(registry.warm_all)
    register_after_restore(after_restore)


def after_restore() -> None:
    clients.reset()
    random.seed()
    request_meta.new_id_prefix()
