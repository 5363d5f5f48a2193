"""OpenTelemetry traces: a span per inference with its stages as children, W3C ``traceparent`` in and out.

Off unless configured, and then free: :func:`configure` sets tracing up only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, spans
then exported over OTLP/HTTP in batches (on Lambda, flushed before each invocation returns),
or ``OTEL_TRACES_EXPORTER=console`` (the emulator's local view: spans as JSON on stdout);
otherwise OpenTelemetry is not even imported, and every call here returns at its first line.

A request's span (kind SERVER, ``POST /v2/models/{model_name}/infer`` or the gRPC method, see
:func:`start_request`) continues the caller's trace when the
request carries ``traceparent`` (HTTP header, gRPC metadata). It is the current span while
the data plane works, so a cascade's follow-up job carries it on (the ``traceparent``
message attribute, :func:`current_traceparent`); the stage spans (decode, queue, infer,
encode) are written when the request ends, from the timings Server-Timing reports, so
tracing adds no clock reads to the stages. The SQS handler continues each job's trace
(:func:`job_spans`): its processing span joins the trace of the request that sent it, and
the batch's span links them all. The tracer and propagator are fnserve's own, not
OpenTelemetry's global ones: an application embedding fnserve keeps its own setup.

A traced request costs CPU in the SDK (five spans) and more with OTLP export, a noticeable share of a small
model's request (docs/design/observability.md): at high rates, sample
(``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.01``, read by the SDK); a request
sampled out writes no stage spans.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fnserve.observability.logs import logger
from fnserve.observability.request_meta import CALLER

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

TRACEPARENT = "traceparent"
_tracer: Tracer | None = None
_propagator: Any = None
_provider: TracerProvider | None = None  # the one the environment asked for: one per process, flushed by flush()


def configure(provider: TracerProvider | None = None) -> bool:
    """Trace if the environment asks for it (or with ``provider``, as tests do); whether tracing is on. Every
    handler built in a process calls it; the environment's exporter is set up once."""
    global _tracer, _propagator, _provider
    if provider is None:
        if _provider is not None:
            return _tracer is not None
        try:
            provider = _provider_from_environment()
        except ImportError as exc:
            logger.warning(f"tracing is asked for (OTEL_* variables) but cannot start: {exc}; install fnserve[tracing]")
            return False
        if provider is None:
            return _tracer is not None
        _provider = provider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer = provider.get_tracer("fnserve")
    _propagator = TraceContextTextMapPropagator()
    return True


def flush() -> None:
    """Export the spans still buffered, before a Lambda invocation returns. Lambda freezes the process between
    invocations, the exporter's thread with it, and may end it without notice: spans left in the buffer would
    leave with the next invocation or never. Waits at most ``OTEL_INSTRUMENTATION_AWS_LAMBDA_FLUSH_TIMEOUT``
    milliseconds (OpenTelemetry's Lambda instrumentation's variable; 30 s by default, as there)."""
    if _provider is not None:
        _provider.force_flush(int(os.environ.get("OTEL_INSTRUMENTATION_AWS_LAMBDA_FLUSH_TIMEOUT") or 30_000))


def disable() -> None:
    """Stop tracing, exporting what the environment's exporter still holds (tests)."""
    global _tracer, _provider
    _tracer = None
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def _provider_from_environment() -> TracerProvider | None:
    otlp = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    console = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console"
    if not otlp and not console:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    service = os.environ.get("OTEL_SERVICE_NAME") or os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or "fnserve"
    provider = TracerProvider(resource=Resource.create({"service.name": service, **platform_attributes()}))
    exporter: SpanExporter
    if console:
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* variables
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


# OpenTelemetry's semantic conventions: the OIP's gRPC service, and gRPC's status codes by name (grpc.StatusCode).
GRPC_SERVICE = "inference.GRPCInferenceService"
_GRPC_CODES = {"OK": 0, "CANCELLED": 1, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5}
_GRPC_CODES |= {"RESOURCE_EXHAUSTED": 8, "INTERNAL": 13, "UNAVAILABLE": 14}


def platform_attributes() -> dict[str, str | int]:
    """The resource's ``cloud.*`` and ``faas.*`` attributes on AWS Lambda and Google Cloud Functions (their
    runtimes' variables), as OpenTelemetry's FaaS conventions name them; none elsewhere."""
    env = os.environ
    if env.get("AWS_LAMBDA_FUNCTION_NAME"):
        found: dict[str, str | int] = {
            "cloud.provider": "aws",
            "cloud.platform": "aws_lambda",
            "faas.name": env["AWS_LAMBDA_FUNCTION_NAME"],
        }
        for key, variable in (
            ("cloud.region", "AWS_REGION"),
            ("faas.version", "AWS_LAMBDA_FUNCTION_VERSION"),
            ("faas.instance", "AWS_LAMBDA_LOG_STREAM_NAME"),
        ):
            if env.get(variable):
                found[key] = env[variable]
        if env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "").isdigit():
            found["faas.max_memory"] = int(env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"]) * 2**20  # bytes
        return found
    if env.get("K_SERVICE") and env.get("FUNCTION_TARGET"):  # Cloud Functions (2nd gen) on Cloud Run
        found = {"cloud.provider": "gcp", "cloud.platform": "gcp_cloud_functions", "faas.name": env["K_SERVICE"]}
        if env.get("K_REVISION"):
            found["faas.version"] = env["K_REVISION"]
        if env.get("GOOGLE_CLOUD_PROJECT"):
            found["cloud.account.id"] = env["GOOGLE_CLOUD_PROJECT"]
        return found
    return {}


class RequestSpan:
    """An inference's span while it runs: current (for follow-ups), ended by :meth:`end` with its stages."""

    __slots__ = ("span", "token", "started_ns", "grpc")

    def __init__(self, span: Span, token: object, started_ns: int, grpc: bool = False) -> None:
        self.span = span
        self.token = token
        self.started_ns = started_ns
        self.grpc = grpc

    def end(self, status: int, timings: dict[str, float] | None = None, error: str | None = None) -> None:
        """End the span: its HTTP status, its error, and a child span per stage (laid end to end from its start)."""
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        assert _tracer is not None
        span = self.span
        if not span.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): nothing to write
            context.detach(self.token)  # type: ignore[arg-type]
            return
        if self.grpc:
            from fnserve.core.errors import grpc_code

            code = "OK" if status < 400 else "CANCELLED" if status == 499 else grpc_code(status)  # 499: caller gone
            span.set_attribute("rpc.grpc.status_code", _GRPC_CODES.get(code, 2))
        else:
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


def start_request(
    name: str, version: str | None, transport: str, traceparent: str | None, route: str | None = None
) -> RequestSpan | None:
    """The span of an inference on ``name`` (None when tracing is off), current until it ends; named and described
    as OpenTelemetry's semantic conventions have a server span: ``{method} {route}`` with ``http.*`` and ``url.path``
    over HTTP (``route``: a fixed one, SageMaker's ``/invocations``; else the V2 route), ``{service}/{method}``
    with ``rpc.*`` over gRPC."""
    if _tracer is None:
        return None
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    parent = _propagator.extract({TRACEPARENT: traceparent}) if traceparent else None
    started = time.time_ns()
    attributes: dict[str, str] = {"fnserve.model": name, "fnserve.transport": transport}
    grpc = transport == "grpc"
    if grpc:
        title = f"{GRPC_SERVICE}/ModelInfer"
        attributes |= {"rpc.system": "grpc", "rpc.service": GRPC_SERVICE, "rpc.method": "ModelInfer"}
    elif route is not None:
        title = f"POST {route}"
        attributes |= {"http.request.method": "POST", "http.route": route, "url.path": route}
    else:
        route = "/v2/models/{model_name}" + ("/versions/{model_version}" if version else "") + "/infer"
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
        title = f"POST {route}"
        attributes |= {"http.request.method": "POST", "http.route": route, "url.path": path}
    if version:
        attributes["fnserve.model_version"] = version
    caller = CALLER.get()
    if caller is not None:
        attributes["fnserve.api_key_id"] = caller
    span = _tracer.start_span(title, context=parent, kind=SpanKind.SERVER, start_time=started, attributes=attributes)
    token = context.attach(trace.set_span_in_context(span))
    return RequestSpan(span, token, started, grpc)


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
        attributes={
            "messaging.system": "aws_sqs",
            "messaging.operation.type": "process",
            "messaging.batch.message_count": len(records),
        },
    )
    batch_link = [Link(batch.get_span_context())]
    for message_id, parent in parents.items():
        span = _tracer.start_span(
            "process job",
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=started_ns,
            links=batch_link,
            attributes={
                "messaging.system": "aws_sqs",
                "messaging.operation.type": "process",
                "messaging.message.id": message_id,
            },
        )
        if message_id in failed:
            span.set_status(Status(StatusCode.ERROR, "the job will be delivered again"))
        span.end(end_time=end_ns)
    batch.end(end_time=end_ns)
