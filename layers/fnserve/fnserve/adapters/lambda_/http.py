"""The Lambda HTTP handler: API Gateway (REST v1, HTTP API v2) and ALB events -> Mangum -> the app.

Everything is built once per container, at import of the function's ``app.py`` (warm
globals); Mangum's lifespan is off, since Mangum would run it on every invocation, and any
Host header a client sends is answered (:mod:`fnserve.adapters.lambda_.asgi`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from fnserve import bootstrap
from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_ import asgi as lambda_asgi
from fnserve.adapters.lambda_ import snapstart
from fnserve.adapters.logs import logger
from fnserve.core.service import InferenceService
from fnserve.settings import Settings

# Only JSON is text; everything else (the binary tensor extension's application/octet-stream)
# is base64-encoded for API Gateway, which decodes it back to bytes for the client.
TEXT_MIME_TYPES = ["application/json"]

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


class EmfTelemetry:
    """Per-request EMF metrics: requests, status and stage latencies, by model."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def record(self, model: str, status: int, timings: dict[str, float], cache: str) -> None:
        # One request per invocation, so the dimensions describe exactly this request.
        self.metrics.add_dimension(name="model", value=model)
        self.metrics.add_dimension(name="status", value=str(status))
        self.metrics.add_metric(name="Requests", unit=MetricUnit.Count, value=1)
        if status >= 400:
            self.metrics.add_metric(name="Errors", unit=MetricUnit.Count, value=1)
        for stage, ms in timings.items():
            self.metrics.add_metric(name=f"{stage.capitalize()}Latency", unit=MetricUnit.Milliseconds, value=ms)
        if timings:
            self.metrics.add_metric(name="Latency", unit=MetricUnit.Milliseconds, value=sum(timings.values()))
        if cache != "off":
            self.metrics.add_metric(
                name="CacheHits" if cache == "hit" else "CacheMisses", unit=MetricUnit.Count, value=1
            )


def create_handler(
    service: InferenceService | None = None,
    settings: Settings | None = None,
    metrics: Metrics | None = None,
) -> LambdaHandler:
    """The Lambda handler for the HTTP API; build it once, at import."""
    settings = settings or Settings()
    store = bootstrap.result_store(settings, for_requests=True)
    plane = bootstrap.build_dataplane(
        settings, service=service or bootstrap.build_service(settings, store), store=store
    )
    metrics = metrics or Metrics(namespace="fnserve", service="fnserve")
    app = create_app(plane, settings, telemetry=EmfTelemetry(metrics))
    asgi = lambda_asgi.adapter(app, TEXT_MIME_TYPES)

    snapstart.register()

    @logger.inject_lambda_context(clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        try:
            return asgi(event, context)
        finally:
            # Only inference records figures; flushing an empty set would warn on every GET.
            if metrics.metric_set:
                metrics.flush_metrics()

    return handler
