"""OpenTelemetry traces: a span per inference with its stages as children, W3C ``traceparent`` in and out.

Off unless configured, and then free: :func:`configure` sets tracing up only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, spans
then exported over OTLP/HTTP in batches, or ``OTEL_TRACES_EXPORTER=console`` (the emulator's
local view: spans as JSON on stdout); otherwise OpenTelemetry is not even imported, and every
call here returns at its first line.

A request's span (``infer <name>``, kind SERVER) continues the caller's trace when the
request carries ``traceparent`` (HTTP header, gRPC metadata). It is the current span while
the data plane works, so a cascade's follow-up job carries it on (the ``traceparent``
message attribute, :func:`current_traceparent`); the stage spans (decode, queue, infer,
encode) are written when the request ends, from the timings Server-Timing reports, so
tracing adds no clock reads to the stages. The SQS handler continues each job's trace
(:func:`job_spans`): its processing span joins the trace of the request that sent it, and
the batch's span links them all. The tracer and propagator are fnserve's own, not
OpenTelemetry's global ones: an application embedding fnserve keeps its own setup.

A traced request costs ~80 µs of CPU in the SDK (five spans), ~250 µs in the server with
OTLP export (bench_metrics): at high rates, sample (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``,
``OTEL_TRACES_SAMPLER_ARG=0.01``, read by the SDK); a request sampled out writes no stage spans.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fnserve.adapters.logs import logger

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

TRACEPARENT = "traceparent"
_tracer: Tracer | None = None
_propagator: Any = None


def configure(provider: TracerProvider | None = None) -> bool:
    """Trace if the environment asks for it (or with ``provider``, as tests do); whether tracing is on."""
    global _tracer, _propagator
    if provider is None:
        try:
            provider = _provider_from_environment()
        except ImportError as exc:
            logger.warning(f"tracing is asked for (OTEL_* variables) but cannot start: {exc}; install fnserve[tracing]")
            return False
        if provider is None:
            return _tracer is not None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer = provider.get_tracer("fnserve")
    _propagator = TraceContextTextMapPropagator()
    return True


def disable() -> None:
    """Stop tracing (tests)."""
    global _tracer
    _tracer = None


def _provider_from_environment() -> TracerProvider | None:
    otlp = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    console = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console"
    if not otlp and not console:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    service = os.environ.get("OTEL_SERVICE_NAME") or os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or "fnserve"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter: SpanExporter
    if console:
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* variables
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class RequestSpan:
    """An inference's span while it runs: current (for follow-ups), ended by :meth:`end` with its stages."""

    __slots__ = ("span", "token", "started_ns")

    def __init__(self, span: Span, token: object, started_ns: int) -> None:
        self.span = span
        self.token = token
        self.started_ns = started_ns

    def end(self, status: int, timings: dict[str, float] | None = None, error: str | None = None) -> None:
        """End the span: its HTTP status, its error, and a child span per stage (laid end to end from its start)."""
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        assert _tracer is not None
        span = self.span
        if not span.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): nothing to write
            context.detach(self.token)  # type: ignore[arg-type]
            return
        span.set_attribute("http.response.status_code", status)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        end_ns = time.time_ns()
        if timings:
            parent = trace.set_span_in_context(span)
            at = self.started_ns
            for stage in ("decode", "queue", "infer", "encode"):
                ms = timings.get(stage)
                if ms is None:
                    continue
                until = min(end_ns, at + int(ms * 1e6))
                _tracer.start_span(stage, context=parent, start_time=at).end(end_time=until)
                at = until
        span.end(end_time=end_ns)
        context.detach(self.token)  # type: ignore[arg-type]


def start_request(name: str, transport: str, traceparent: str | None) -> RequestSpan | None:
    """The span of an inference on ``name`` (None when tracing is off), current until it ends."""
    if _tracer is None:
        return None
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    parent = _propagator.extract({TRACEPARENT: traceparent}) if traceparent else None
    started = time.time_ns()
    span = _tracer.start_span(
        f"infer {name}",
        context=parent,
        kind=SpanKind.SERVER,
        start_time=started,
        attributes={"fnserve.model": name, "fnserve.transport": transport},
    )
    token = context.attach(trace.set_span_in_context(span))
    return RequestSpan(span, token, started)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, for a message that continues its trace (None: not tracing)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get(TRACEPARENT)


def traceparent_of(record: dict[str, Any]) -> str | None:
    """The ``traceparent`` message attribute of an SQS record in a Lambda event."""
    attribute = (record.get("messageAttributes") or {}).get(TRACEPARENT)
    return attribute.get("stringValue") if isinstance(attribute, dict) else None


def job_spans(records: Sequence[dict[str, Any]], started_ns: int, failures: Iterable[str]) -> None:
    """Spans for an SQS batch processed from ``started_ns`` to now: one for the batch, linking every traced
    record, and one per traced record in its sender's trace (a follow-up joins its request's trace)."""
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    failed = set(failures)
    parents = {r["messageId"]: _propagator.extract({TRACEPARENT: tp}) for r in records if (tp := traceparent_of(r))}
    links = [Link(trace.get_current_span(ctx).get_span_context()) for ctx in parents.values()]
    end_ns = time.time_ns()
    batch = _tracer.start_span(
        "process jobs",
        kind=SpanKind.CONSUMER,
        start_time=started_ns,
        links=links,
        attributes={"messaging.system": "aws_sqs", "messaging.batch.message_count": len(records)},
    )
    batch_link = [Link(batch.get_span_context())]
    for message_id, parent in parents.items():
        span = _tracer.start_span(
            "process job",
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=started_ns,
            links=batch_link,
            attributes={"messaging.system": "aws_sqs", "messaging.message.id": message_id},
        )
        if message_id in failed:
            span.set_status(Status(StatusCode.ERROR, "the job will be delivered again"))
        span.end(end_time=end_ns)
    batch.end(end_time=end_ns)
