"""Logs on Google Cloud: Cloud Logging's structured JSON, each line of a request carrying its trace.

Cloud Run passes a request's trace as ``X-Cloud-Trace-Context: TRACE/SPAN;o=1`` or W3C
``traceparent``. Every log line written while the request is answered (the access line too)
then carries ``logging.googleapis.com/trace`` (``projects/P/traces/TRACE``, which links it to
the request in the log viewer and in Cloud Trace), its span and whether it is sampled, and the
request id is the trace id unless the caller sent an ``X-Request-Id``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from fnserve.observability.logs import cloud_logging, request_keys

TRACE = "logging.googleapis.com/trace"
SPAN = "logging.googleapis.com/spanId"
SAMPLED = "logging.googleapis.com/trace_sampled"
_CLOUD_TRACE = re.compile(r"^([0-9a-fA-F]{32})(?:/(\d+))?(?:;o=([01]))?")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def use_cloud_logging() -> None:
    """fnserve's lines in Cloud Logging's shape (``severity``, ``time``)."""
    cloud_logging(True)


def project() -> str | None:
    """The project traces belong to: GOOGLE_CLOUD_PROJECT (the deploy script sets it), else GCP_PROJECT."""
    return os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("GCP_PROJECT") or None


def trace_of(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str | None, bool] | None:
    """(trace id, span id in hex, sampled) of a request's trace headers (ASGI's), or None without any."""
    cloud = parent = None
    for key, value in headers:
        if key == b"x-cloud-trace-context":
            cloud = value.decode("latin-1")
        elif key == b"traceparent":
            parent = value.decode("latin-1")
    if parent is not None and (match := _TRACEPARENT.match(parent)):
        return match[1], match[2], int(match[3], 16) & 1 == 1
    if cloud is not None and (match := _CLOUD_TRACE.match(cloud)):
        span = f"{int(match[2]):016x}" if match[2] else None  # Cloud Logging wants it in hex
        return match[1].lower(), span, match[3] == "1"
    return None


def bind_trace(scope: dict[str, Any]) -> None:
    """Put the request's trace in every log line of the request; make the trace id its request id
    when the caller named none (an ``x-request-id`` header added to ``scope``)."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
    found = trace_of(headers)
    if found is None:
        return
    trace, span, sampled = found
    where = project()
    fields: dict[str, Any] = {TRACE: f"projects/{where}/traces/{trace}" if where else trace, SAMPLED: sampled}
    if span is not None:
        fields[SPAN] = span
    request_keys(**fields)
    if not any(key == b"x-request-id" for key, _ in headers):
        scope["headers"] = [*headers, (b"x-request-id", trace.encode())]
