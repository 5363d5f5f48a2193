"""How every transport's requests are watched: a span, an access line, a metrics record per request.

The envelope of a request (decode, infer, encode, timings, the deadline, the mapping of errors) is
:meth:`fnserve.core.serving.dataplane.DataPlane.serve`, the same for every transport; what it tells of each
request goes to a :class:`RequestRecorder`, one per transport, which writes it where this process
writes such things (OpenTelemetry, the structured log, Prometheus or EMF).
"""

from __future__ import annotations

from typing import Protocol

from fnserve.core.errors import FnserveError
from fnserve.core.serving.dataplane import Answer
from fnserve.observability import logs, tracing

# The V2 protocol extensions fnserve speaks, on every transport (Triton's names).
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration"]


class Telemetry(Protocol):
    """The metrics sink a :class:`RequestRecorder` counts each request in (EMF in Lambda, Prometheus in the server)."""

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None: ...


class NoTelemetry:
    """The sink where no metrics are kept: each record dropped."""

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None:
        return None


class RequestRecorder:
    """Watches one transport's requests; ``transport`` names it in spans and (beside HTTP) in access lines."""

    def __init__(self, transport: str, telemetry: Telemetry, *, access_log: bool, route: str | None = None) -> None:
        self.transport = transport
        self.route = route  # a fixed HTTP route its spans are named by (SageMaker's /invocations); else V2's
        self.telemetry = telemetry
        self.access_log = access_log
        self.where = {} if transport == "http" else {"transport": transport}

    def start(self, name: str, version: str | None, traceparent: str | None) -> _Recording:
        return _Recording(self, name, tracing.start_request(name, version, self.transport, traceparent, self.route))


class _Recording:
    __slots__ = ("name", "recorder", "span")

    def __init__(self, recorder: RequestRecorder, name: str, span: tracing.RequestSpan | None) -> None:
        self.recorder = recorder
        self.name = name
        self.span = span

    def served(self, answer: Answer, timings: dict[str, float]) -> None:
        recorder = self.recorder
        if recorder.access_log:
            fields = {"model": self.name, "version": answer.version, "status": 200, "cache": answer.cache, **timings}
            if answer.device:
                fields["device"] = answer.device
            logs.access("inference", fields | recorder.where)
        recorder.telemetry.record(self.name, 200, timings, answer.cache, answer.version)
        if self.span is not None:
            self.span.end(200, timings)

    def refused(self, error: FnserveError) -> None:
        recorder = self.recorder
        if recorder.access_log:
            fields = {"model": self.name, "status": error.status_code, "error": error.message}
            logs.access("inference refused", fields | recorder.where)
        recorder.telemetry.record(self.name, error.status_code, {}, "off")
        if self.span is not None:
            self.span.end(error.status_code, error=error.message)

    def cancelled(self, reason: str) -> None:
        if self.span is not None:
            self.span.end(499, error=reason)
