"""The Lambda HTTP handler: API Gateway (REST v1, HTTP API v2) and ALB events -> Mangum -> the app.

Everything is built once per container, at import of the function's ``app.py`` (warm
globals, started by the handler base, :mod:`fnserve.adapters.handler`); Mangum's lifespan is
off, since Mangum would run it on every invocation, and any Host header a client sends is
answered (:mod:`fnserve.adapters.lambda_.asgi`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import orjson

from fnserve.adapters.handler import lambda_handler, start_requests
from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_ import asgi as lambda_asgi
from fnserve.adapters.lambda_ import snapstart
from fnserve.core.execution.service import InferenceService
from fnserve.observability import logs
from fnserve.settings import Settings

# Only JSON is text; everything else (the binary tensor extension's application/octet-stream)
# is base64-encoded for API Gateway, which decodes it back to bytes for the client.
TEXT_MIME_TYPES = ["application/json"]

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


class EmfTelemetry:
    """Per-request metrics in CloudWatch's embedded metric format, by model and status: one JSON line an invocation.

    A Lambda container answers one request per invocation, so the dimensions describe exactly
    that request. The line is built and written here (one dict, one orjson call) rather than
    through Powertools' Metrics, whose per-metric validation and per-flush serialisation show
    on the hot path; the format is the same (namespace, ``service`` / ``model`` / ``status``
    dimensions, Count and Milliseconds units).
    """

    def __init__(self, namespace: str | None = None, service: str | None = None, out: TextIO | None = None) -> None:
        # What the template sets (Powertools' variables), else fnserve's names.
        self.namespace = namespace or os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "fnserve"
        self.service = service or os.environ.get("POWERTOOLS_SERVICE_NAME") or "fnserve"
        self.out = out
        self.disabled = logs.truthy("POWERTOOLS_METRICS_DISABLED")  # as Powertools' own Metrics honours it
        self._pending: dict[str, Any] | None = None

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None:
        if self.disabled:
            return
        counts = {"Requests": 1.0}
        if status >= 400:
            counts["Errors"] = 1.0
        if cache != "off":
            counts["CacheHits" if cache == "hit" else "CacheMisses"] = 1.0
        latencies = {f"{stage.capitalize()}Latency": ms for stage, ms in timings.items()}
        if timings:
            latencies["Latency"] = round(sum(timings.values()), 3)
        units = [{"Name": n, "Unit": "Count"} for n in counts] + [
            {"Name": n, "Unit": "Milliseconds"} for n in latencies
        ]
        self._pending = {
            "_aws": {
                "Timestamp": int(time.time() * 1000),
                "CloudWatchMetrics": [
                    {"Namespace": self.namespace, "Dimensions": [["service", "model", "status"]], "Metrics": units}
                ],
            },
            "service": self.service,
            "model": model,
            "status": str(status),
            **counts,
            **latencies,
        }

    def flush(self) -> None:
        """Write what this invocation recorded, if anything (a GET records nothing)."""
        if self._pending is not None:
            out = self.out or sys.stdout  # looked up late: Lambda's and pytest's stdout
            out.write(orjson.dumps(self._pending).decode() + "\n")
            out.flush()
            self._pending = None


def create_handler(
    service: InferenceService | None = None,
    settings: Settings | None = None,
    telemetry: EmfTelemetry | None = None,
) -> LambdaHandler:
    """The Lambda handler for the HTTP API; build it once, at import."""
    settings, plane = start_requests(settings, service, ready=snapstart.register)
    telemetry = telemetry or EmfTelemetry()
    asgi = lambda_asgi.adapter(create_app(plane, settings, telemetry=telemetry), TEXT_MIME_TYPES)
    return lambda_handler(asgi, telemetry.flush)
