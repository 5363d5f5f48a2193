"""The emulator's console, read like ``sam local``'s: a START, END and REPORT line per invocation.

Each invocation shows as Lambda's log stream shows it, under its function's name::

    BatchFunction  START RequestId: 6f1c...  Version: $LATEST
    BatchFunction    WARNING job refused  job=p-1 error="job p-1: Request for unknown model: 'nope' is not found"
    BatchFunction    metrics JobsReceived=10 JobsDone=9 JobsRefused=1 JobsFailed=0
    BatchFunction  END RequestId: 6f1c...
    BatchFunction  REPORT RequestId: 6f1c...  Duration: 41.20 ms  Billed Duration: 42 ms  Memory Size:
                   2048 MB  Max Memory Used: 210 MB  Init Duration: 812.40 ms  SQS batch: 10 records, 0 failed

Function logs are rendered readably (Powertools' JSON lines as level, message and their own
keys; EMF blobs as one ``metrics`` line); the raw lines, exactly as CloudWatch would get
them, go to the log file.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any, TextIO

from fnserve.observability.lines import LineWriter
from fnserve.observability.logs import render
from fnserve.workers.messages import Usage
from fnserve.workers.pool import FunctionSpec


class Console:
    """Renders invocations (a :class:`~fnserve.workers.pool.Observer`) to ``out``; raw lines to ``raw``."""

    def __init__(self, out: TextIO, raw: TextIO | None = None) -> None:
        self.out = out
        self.raw = raw
        self._lock = threading.Lock()
        self._width = 14

    def expect(self, names: list[str]) -> None:
        """The names lines will carry (the template's functions): one column width from the first line on."""
        self._width = max(self._width, *(len(n) for n in names))

    def name(self, function: str) -> str:
        self._width = max(self._width, len(function))
        return function.ljust(self._width)

    def started(self, spec: FunctionSpec, request_id: str) -> None:
        self._print(f"{self.name(spec.name)}  START RequestId: {request_id}  Version: $LATEST")

    def output(self, spec: FunctionSpec, request_id: str | None, text: str) -> None:
        if self.raw is not None:
            with self._lock:
                self.raw.write(text + "\n")
                self.raw.flush()
        rendered = render(text)
        if rendered is not None:
            self._print(f"{self.name(spec.name)}    {rendered}")

    def finished(
        self, spec: FunctionSpec, request_id: str, event: Any, response: Any, error: str | None, usage: Usage | None
    ) -> None:
        name = self.name(spec.name)
        report = [f"REPORT RequestId: {request_id}"]
        if usage is not None:
            report += [
                f"Duration: {usage.duration_ms:.2f} ms",
                f"Billed Duration: {math.ceil(usage.duration_ms)} ms",
                f"Memory Size: {spec.memory_mb} MB",
                f"Max Memory Used: {usage.max_memory_mb} MB",
            ]
            if usage.init_ms is not None:
                report.append(f"Init Duration: {usage.init_ms:.2f} ms")
        report += _what(event, response, error)
        lines = [f"{name}  END RequestId: {request_id}", f"{name}  " + "  ".join(report)]
        if error is not None:
            lines.insert(0, f"{name}    ERROR   {error}")
        self._print(*lines)

    def stream(self, source: str) -> io.TextIOBase:
        """A text stream whose lines show as ``source``'s (the emulator's own log lines)."""
        spec = FunctionSpec(source, "")
        return LineWriter(lambda line: self.output(spec, None, line))

    def _print(self, *lines: str) -> None:
        with self._lock:
            for line in lines:
                self.out.write(line + "\n")
            self.out.flush()


def _what(event: Any, response: Any, error: str | None) -> list[str]:
    """What the invocation was about: an SQS batch and its failures, or an HTTP request and its status."""
    if not isinstance(event, dict):
        return []
    records = event.get("Records")
    if isinstance(records, list) and records and records[0].get("eventSource") == "aws:sqs":
        if error is not None:
            failed: Any = "all"
        elif isinstance(response, dict):
            failed = len(response.get("batchItemFailures") or [])
        else:
            failed = 0
        return [f"SQS batch: {len(records)} records, {failed} failed"]
    context = event.get("requestContext")
    if isinstance(context, dict):
        http = context.get("http") or {}
        method = http.get("method") or event.get("httpMethod", "")
        path = event.get("rawPath") or event.get("path", "")
        status = response.get("statusCode") if isinstance(response, dict) else "error"
        return [f"HTTP: {method} {path} -> {status}"]
    return []
