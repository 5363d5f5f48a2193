"""Lambda's metrics: CloudWatch's embedded metric format, one JSON line on stdout that CloudWatch Logs turns into
metrics. Both Lambda handlers write theirs here, the API function a line per request, the batch function a line
per delivery.

The line is built as one dict and written with one orjson call rather than through Powertools' Metrics, whose
per-metric validation and per-flush serialisation show on the hot path. The document is the one Powertools writes:
the namespace from ``POWERTOOLS_METRICS_NAMESPACE``, a ``service`` dimension from ``POWERTOOLS_SERVICE_NAME``,
nothing at all with ``POWERTOOLS_METRICS_DISABLED``, Count and Milliseconds units.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import orjson

from fnserve.observability import logs


class EmfWriter:
    """Writes EMF lines under one namespace and service (what the template sets, else fnserve's names)."""

    def __init__(
        self,
        namespace: str | None = None,
        service: str | None = None,
        out: TextIO | None = None,
        *,
        default_service: str = "fnserve",
    ) -> None:
        self.namespace = namespace or os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "fnserve"
        self.service = service or os.environ.get("POWERTOOLS_SERVICE_NAME") or default_service
        self.out = out
        self.disabled = logs.truthy("POWERTOOLS_METRICS_DISABLED")

    def document(
        self,
        dimensions: Mapping[str, str],
        counts: Mapping[str, float],
        milliseconds: Mapping[str, float] | None = None,
    ) -> dict[str, Any]:
        """One EMF document: every dimension and metric a member of the root, as CloudWatch requires."""
        units = [{"Name": n, "Unit": "Count"} for n in counts]
        if milliseconds:
            units += [{"Name": n, "Unit": "Milliseconds"} for n in milliseconds]
        return {
            "_aws": {
                "Timestamp": int(time.time() * 1000),
                "CloudWatchMetrics": [
                    {"Namespace": self.namespace, "Dimensions": [["service", *dimensions]], "Metrics": units}
                ],
            },
            "service": self.service,
            **dimensions,
            **counts,
            **(milliseconds or {}),
        }

    def write(self, document: Mapping[str, Any]) -> None:
        out = self.out or sys.stdout  # looked up late: Lambda's and pytest's stdout
        out.write(orjson.dumps(document).decode() + "\n")
        out.flush()


class EmfTelemetry:
    """The API function's metrics by model and status, one line an invocation: a Lambda container answers one
    request per invocation, so the dimensions describe exactly that request."""

    def __init__(self, writer: EmfWriter | None = None) -> None:
        self.writer = writer or EmfWriter()
        self._pending: dict[str, Any] | None = None

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None:
        if self.writer.disabled:
            return
        counts = {"Requests": 1.0}
        if status >= 400:
            counts["Errors"] = 1.0
        if cache != "off":
            counts["CacheHits" if cache == "hit" else "CacheMisses"] = 1.0
        latencies = {f"{stage.capitalize()}Latency": ms for stage, ms in timings.items()}
        if timings:
            latencies["Latency"] = round(sum(timings.values()), 3)
        self._pending = self.writer.document({"model": model, "status": str(status)}, counts, latencies)

    def flush(self) -> None:
        """Write what this invocation recorded, if anything (a GET records nothing)."""
        if self._pending is not None:
            self.writer.write(self._pending)
            self._pending = None
