"""An inference worker of ``fnserve serve``: every model loaded once, then whatever the front process sends.

The worker pool imports this module once per worker process (the warm globals), with the
server's settings in ``FNSERVE_*`` variables; see :mod:`fnserve.workers.remote`.
"""

from __future__ import annotations

from typing import Any

from fnserve.bootstrap import build_service
from fnserve.core.host import freeze_heap
from fnserve.server.layout import pin_inference
from fnserve.settings import Settings
from fnserve.workers.messages import Describe, RunModel
from fnserve.workers.remote import handle

SETTINGS = Settings()
SERVICE = build_service(SETTINGS)  # no result cache tier: the front process caches
pin_inference(SETTINGS)  # after the load: every thread of ORT's pools is pinned with the process
freeze_heap()


def handler(event: RunModel | Describe, context: Any) -> Any:
    return handle(SERVICE, event)
