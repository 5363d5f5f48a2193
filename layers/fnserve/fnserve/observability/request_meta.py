"""What every transport says of a request: its id, made here where the caller brought none, and its stage timings
as a Server-Timing value (an HTTP header, gRPC trailing metadata)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from contextvars import ContextVar

# Request ids made here: unique per process (random prefix) and cheap (a counter, no uuid4 per request).
_ID_PREFIX = uuid.uuid4().hex[:12]
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A request id made here, for a request that brought none."""
    return f"{_ID_PREFIX}-{next(_ID_COUNTER):x}"


def new_id_prefix() -> None:
    """A new prefix for the request ids made here (after a SnapStart restore, whose processes would share one)."""
    global _ID_PREFIX
    _ID_PREFIX = uuid.uuid4().hex[:12]


def server_timing(timings: Mapping[str, float], device: str | None = None) -> str:
    """The Server-Timing value of stage timings (milliseconds): ``decode;dur=0.1, infer;dur=0.3, ...``, and
    ``device;desc=cuda:0`` where a device is named."""
    value = ", ".join([f"{stage};dur={ms}" for stage, ms in timings.items()])
    return f'{value}, device;desc="{device}"' if device else value


# The id of the API key the request in this task came with (fnserve.adapters.keys), for its span; None: no key asked.
CALLER: ContextVar[str | None] = ContextVar("fnserve_caller", default=None)
