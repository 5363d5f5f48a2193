"""An inference worker of ``fnserve serve``: every model loaded once, then whatever the front process sends.

The worker pool imports this module once per worker process (the warm globals), with the
server's settings in ``FNSERVE_*`` variables; see :mod:`fnserve.core.pooled`.
"""

from __future__ import annotations

from typing import Any

from fnserve.aws.s3 import fetch_model
from fnserve.core._heap import freeze_heap
from fnserve.core.pooled import handle
from fnserve.core.service import InferenceService
from fnserve.core.settings import Settings

SERVICE = InferenceService.from_settings(Settings(), fetchers={"s3": fetch_model})
freeze_heap()


def handler(event: dict[str, Any], context: Any) -> Any:
    return handle(SERVICE, event)
