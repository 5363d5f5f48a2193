"""Moto's SQS at the depth of a real batch load, for the emulator's embedded server.

Under a load of batch jobs, most of the embedded moto server's time goes to ``Queue.attributes``:
moto 5.2 recomputes every attribute, three of them scans of the whole queue that read the clock
twice per message, for each message sent (a ContentBasedDeduplication lookup) and for each message
received (its retention check goes through GetQueueAttributes, which rebuilds the attributes once
per name asked). A delete scans the queue twice per receipt handle. A deep queue then drains in
minutes instead of seconds (docs/design/emulator-sqs.md).

These patches change what moto's SQS costs, not what it does: the same messages, receipt
handles, visibility, redrive and errors. A message's visibility is read against one clock
reading per scan; the approximate counts (approximate in SQS too) are computed in one pass
and reused for 100 ms while no message comes or goes; the retention check reads the queue's retention period directly; a
delete stops at the message that had the handle. They are applied to the moto versions they
were written against only (see ``VERSIONS``); with another, the emulator runs unpatched,
slower, and says so.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

VERSIONS = ("5.1.", "5.2.")
COUNTS_TTL = 0.1  # seconds the approximate counts are reused
_applied = False


def apply() -> bool:
    """Patch moto's SQS models in this process (once); False if this moto version is not one we know."""
    global _applied
    if _applied:
        return True
    import moto
    from moto.sqs import models

    if not moto.__version__.startswith(VERSIONS):
        logger.warning(
            "moto %s is not a version fnserve's SQS speed-ups know (%s): deep queues will be slow",
            moto.__version__,
            ", ".join(v + "x" for v in VERSIONS),
        )
        return False
    patches: dict[type, dict[str, Any]] = {
        models.Queue: {
            "messages": property(_visible_messages),
            "approximate_number_of_messages": property(lambda self: _counts(self)[0]),
            "approximate_number_of_messages_delayed": property(lambda self: _counts(self)[1]),
            "approximate_number_of_messages_not_visible": property(lambda self: _counts(self)[2]),
            "delete_message": _delete_message,
        },
        models.SQSBackend: {
            "is_message_valid_based_on_retention_period": _retained,
            # What changes visibility without adding or removing a message drops the reused counts.
            "receive_message": _recounting(models.SQSBackend.receive_message),
            "change_message_visibility": _recounting(models.SQSBackend.change_message_visibility),
        },
    }
    for cls, members in patches.items():
        for name, member in members.items():
            setattr(cls, name, member)
    _applied = True
    return True


def _now_ms() -> float:
    from moto.core.utils import unix_time_millis

    return float(unix_time_millis())


def _visible_messages(queue: Any) -> list[Any]:
    """Messages visible and not delayed, in queue order (moto's ``Queue.messages``, one clock reading)."""
    now = _now_ms()
    return [m for m in queue._messages if now > m.visible_at and not now < m.delayed_until]


def _counts(queue: Any) -> tuple[int, int, int]:
    """(visible, delayed, not visible), as moto counts them, in one pass; reused for COUNTS_TTL while no
    message comes or goes and none is received or changes visibility (a visibility timeout that
    runs out shows within COUNTS_TTL)."""
    cached = queue.__dict__.get("_fnserve_counts")
    if cached is not None and cached[0] > time.monotonic() and cached[1] == len(queue._messages):
        return cached[2]  # type: ignore[no-any-return]
    now = _now_ms()
    visible = delayed = hidden = 0
    for m in queue._messages:
        is_visible, is_delayed = now > m.visible_at, now < m.delayed_until
        visible += is_visible and not is_delayed
        delayed += is_delayed
        hidden += not is_visible
    counts = (visible, delayed, hidden)
    queue.__dict__["_fnserve_counts"] = (time.monotonic() + COUNTS_TTL, len(queue._messages), counts)
    return counts


def _recounting(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of the backend (queue name first), dropping that queue's reused counts after it."""

    @functools.wraps(method)
    def wrapper(backend: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(backend, queue_name, *args, **kwargs)
        finally:
            backend.get_queue(queue_name).__dict__.pop("_fnserve_counts", None)

    return wrapper


def _delete_message(queue: Any, receipt_handle: str) -> None:
    """moto's ``Queue.delete_message``: one scan that stops at the message that had the handle."""
    from moto.sqs.exceptions import ReceiptHandleIsInvalid

    if receipt_handle in queue.deleted_messages:
        return  # already deleted: deleting again is fine, as in SQS
    for index, message in enumerate(queue._messages):
        if message.receipt_handle == receipt_handle or receipt_handle in message._old_receipt_handles:
            del queue._messages[index]
            queue.pending_messages.discard(message)
            queue.deleted_messages.update(message.all_receipt_handles)
            queue.__dict__.pop("_fnserve_counts", None)
            return
    raise ReceiptHandleIsInvalid()


def _retained(backend: Any, queue_name: str, message: Any) -> bool:
    """moto's retention check, reading the period from the queue rather than every attribute."""
    period = int(backend.get_queue(queue_name).message_retention_period)
    return bool(period + message.sent_timestamp / 1000 > _now_ms() / 1000)
