"""An OTLP/HTTP trace collector for tests and benchmarks: what fnserve's exporter sends, read back as spans."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class Span:
    """One exported span, as the collector received it."""

    name: str
    kind: int  # OTLP's SpanKind: 2 SERVER, 5 CONSUMER
    trace_id: str  # hex
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]  # its resource's attributes
    status_code: int  # OTLP's: 0 unset, 1 ok, 2 error


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value") or "string_value")


def _attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1 (``endpoint`` for ``OTEL_EXPORTER_OTLP_ENDPOINT``) that answers every
    export 200 and keeps its spans (``keep=False``: reads and drops them, what a collector costs the sender)."""

    def __init__(self, keep: bool = True) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        collector = self

        class Receiver(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if keep and self.path == "/v1/traces":
                    collector._receive(body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(list(resource_spans.resource.attributes))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Span(
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(list(span.attributes)),
                            resource=resource,
                            status_code=span.status.code,
                        )
                    )
        with self._lock:
            self._spans.extend(received)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans() if span.name == name]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
