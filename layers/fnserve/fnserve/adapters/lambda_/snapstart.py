"""Lambda SnapStart: what must not be shared by every copy restored from one snapshot.

AWS clients hold connections and credentials from snapshot time; random state would make
every restored copy draw the same numbers; request ids made here carry a per-process prefix
that must differ between copies. Models, sessions and the app are kept: that is the point.
"""

from __future__ import annotations

import random

from fnserve.adapters.http import wire
from fnserve.aws import clients


def register() -> None:
    """Register :func:`after_restore` with the runtime, where SnapStart is on (a no-op elsewhere)."""
    try:
        from snapshot_restore_py import register_after_restore  # type: ignore[import-not-found]
    except ImportError:
        return
    register_after_restore(after_restore)


def after_restore() -> None:
    clients.reset()
    random.seed()
    wire.new_id_prefix()
