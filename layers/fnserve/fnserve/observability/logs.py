"""fnserve's structured logger (Powertools): JSON lines carrying the request id in adapters.

:func:`access` writes the per-request access line in the same shape without going through
``logging``: Powertools' formatter (a LogRecord, the caller's frame, strftime, the keys
merged per record) is a visible share of a request on the Lambda hot path; one dict and one orjson
call cost far less (docs/design/observability.md).

On Google Cloud (:func:`cloud_logging`) the same lines take Cloud Logging's special fields:
``severity`` for ``level`` and an RFC 3339 ``time`` for ``timestamp``, so the log viewer shows
each line's level and time (and its trace, which the GCP adapters add per request).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

import orjson
from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.formatter import set_context_keys

from fnserve.observability.lines import LineWriter

if TYPE_CHECKING:
    import asyncio  # not imported by the batch function's cold path

_cloud = False  # lines in Cloud Logging's shape


def cloud_logging(on: bool = True) -> None:
    """Write every line in Cloud Logging's structured shape from now on (or Powertools' again)."""
    global _cloud
    _cloud = on


def _cloud_entry(line: dict[str, Any]) -> dict[str, Any]:
    """A line with Cloud Logging's field names: ``severity`` first, ``time`` in RFC 3339."""
    entry = {"severity": line.pop("level", "INFO"), "message": line.pop("message", "")}
    stamp = line.pop("timestamp", None)
    if isinstance(stamp, str):  # Powertools' '2026-11-22 23:43:44,123+0000'
        entry["time"] = stamp.replace(" ", "T", 1).replace(",", ".").replace("+0000", "Z")
    entry.update(line)
    return entry


def _dumps(record: dict[str, Any]) -> str:
    return orjson.dumps(_cloud_entry(record) if _cloud else record, default=str).decode()


# The service name the template sets (POWERTOOLS_SERVICE_NAME), else fnserve's.
logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "fnserve", json_serializer=_dumps)


def request_keys(**keys: Any) -> None:
    """Add ``keys`` (a request's id) to every line logged in this task from now on: what
    ``logger.thread_safe_append_keys`` does, less its walk to the formatter through the logger's handlers
    (paid on every request). The keys live in Powertools' context variable, which its formatter and
    :func:`access` read."""
    set_context_keys(**keys)


FORMAT_ENV = "FNSERVE_LOG_FORMAT"  # json (what log pipelines read), or console (what a person reads)


# What every Powertools line carries: shown by START/REPORT already, or noise on a laptop.
_STANDARD_KEYS = frozenset(
    {
        "level",
        "location",
        "message",
        "timestamp",
        "service",
        "cold_start",
        "function_name",
        "function_memory_size",
        "function_arn",
        "function_request_id",
        "xray_trace_id",
        "sampling_rate",
        "exception",
        "exception_name",
        "stack_trace",
    }
)


def render(line: str) -> str | None:
    """One function log line, readable: Powertools JSON as level, message and extra keys; EMF as metrics."""
    if not line.startswith("{"):
        return line if line.strip() else None
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    if not isinstance(doc, dict):
        return line
    if "_aws" in doc:
        names = [m["Name"] for d in doc["_aws"].get("CloudWatchMetrics", []) for m in d.get("Metrics", [])]
        values = " ".join(f"{n}={_metric(doc.get(n))}" for n in names)
        return f"metrics {values}"
    if "message" not in doc:
        return line
    if "request_id" in doc and doc["request_id"] == doc.get("function_request_id"):
        del doc["request_id"]  # the invocation's own id: its START line shows it
    extras = " ".join(f"{k}={_value(v)}" for k, v in doc.items() if k not in _STANDARD_KEYS)
    text = f"{str(doc.get('level', 'INFO')):<7} {doc['message']}" + (f"  {extras}" if extras else "")
    if doc.get("exception"):
        text += "\n" + "\n".join("      " + part for part in str(doc["exception"]).splitlines())
    return text


def _metric(value: Any) -> str:
    if isinstance(value, list):
        value = sum(value) if all(isinstance(v, int | float) for v in value) else value
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return f'"{text}"' if " " in text else text


class Readable(LineWriter):
    """A stream that writes each JSON log line as a person reads it (the time, then the emulator console's form:
    level, message, the line's own keys); other text as it is."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(self._show)
        self.out = out

    def _show(self, line: str) -> None:
        shown = render(line)
        if shown is not None:
            self.out.write(f"{time.strftime('%H:%M:%S')} {shown}\n" if line.startswith("{") else shown + "\n")

    def flush(self) -> None:
        super().flush()
        self.out.flush()


def readable(out: TextIO | None = None) -> None:
    """Write this process's log lines as a person reads them, to ``out`` (the logger's stream by default)."""
    handler = logger.registered_handler
    stream = getattr(handler, "stream", None)
    if isinstance(stream, Readable):
        return
    handler.setStream(Readable(out or stream or sys.stdout))  # type: ignore[attr-defined]


if os.environ.get(FORMAT_ENV) == "console":  # a server's processes each apply what it chose (fnserve serve)
    readable()


def level(explicit: str | None) -> str:
    """The log level to apply: fnserve's own setting when one was given (``FNSERVE_LOG_LEVEL``); else Powertools'
    ``POWERTOOLS_LOG_LEVEL``, then Lambda's ``AWS_LAMBDA_LOG_LEVEL`` (the function's ``LoggingConfig``
    ``ApplicationLogLevel``), which Powertools itself reads in that order; else INFO."""
    for found in (explicit, os.environ.get("POWERTOOLS_LOG_LEVEL"), os.environ.get("AWS_LAMBDA_LOG_LEVEL")):
        if found:
            return found.upper()
    return "INFO"


def truthy(name: str) -> bool:
    """An environment variable read as Powertools reads its flags (``POWERTOOLS_METRICS_DISABLED=true``)."""
    return os.environ.get(name, "").strip().lower() in ("1", "y", "yes", "t", "true", "on")


def access(message: str, fields: dict[str, Any]) -> None:
    """One INFO line like the logger's (its keys, the request's keys, then ``fields``), straight to its stream;
    in a server process, at the end of its event loop's turn (:class:`AccessLines`)."""
    if logger.log_level > logging.INFO:
        return
    line: dict[str, Any] = {"level": "INFO", "location": "access", "message": message, "timestamp": _timestamp()}
    for key, value in logger.get_current_keys().items():
        if key not in line and value is not None and not (isinstance(value, str) and "%(" in value):
            line[key] = value  # service, and the Lambda context's keys; not the formatter's own specs
    trace = os.environ.get("_X_AMZN_TRACE_ID", "")  # Lambda's, set for each invocation
    if trace:
        line["xray_trace_id"] = trace.partition("Root=")[2].partition(";")[0] or trace
    line |= logger.thread_safe_get_current_keys()
    line |= fields
    if _cloud:
        line = _cloud_entry(line)
    handler = logger.registered_handler
    stream = getattr(handler, "stream", None)
    if stream is None:  # not a stream handler: the slow, general path
        logger.info(message, extra=fields)
        return
    text = orjson.dumps(line, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
    held = _held
    if held is not None and threading.get_ident() == held.thread:
        held.add(text)
        return
    _write(handler, stream, text)


_second: tuple[int, str] = (-1, "")  # the last second an access line was written in, as Powertools writes it


def _timestamp() -> str:
    """Now as Powertools' lines write it (``2026-11-26 02:20:05,635+0000``); the date and time of a second made
    once for all its lines."""
    global _second
    now = time.time()
    second = int(now)
    if second != _second[0]:
        _second = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second)))
    return f"{_second[1]},{int(now % 1 * 1000):03d}+0000"


def _write(handler: logging.Handler, stream: TextIO, text: str) -> None:
    handler.acquire()
    try:
        stream.write(text)
        stream.flush()
    finally:
        handler.release()


class AccessLines:
    """A server process's companion (its lifespan starts and stops it): the access lines of one turn of its event
    loop leave in one write at the turn's end, as its responses do (:mod:`fnserve.adapters.http.protocol`), not
    one write each. Only on the loop's own thread; any other line is written at once."""

    def __init__(self) -> None:
        self.thread = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lines: list[str] = []

    async def start(self) -> None:
        import asyncio

        global _held
        self._loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()
        _held = self

    async def stop(self) -> None:
        global _held
        if _held is self:
            _held = None
        self.flush()

    def add(self, text: str) -> None:
        if not self._lines:
            assert self._loop is not None
            self._loop.call_soon(self.flush)
        self._lines.append(text)

    def flush(self) -> None:
        lines, self._lines = self._lines, []
        handler = logger.registered_handler
        stream = getattr(handler, "stream", None)
        if lines and stream is not None:
            _write(handler, stream, "".join(lines))


_held: AccessLines | None = None  # the server process's, once started
