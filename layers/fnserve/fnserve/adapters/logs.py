"""fnserve's structured logger (Powertools): JSON lines carrying the request id in adapters.

:func:`access` writes the per-request access line in the same shape without going through
``logging``: Powertools' formatter (a LogRecord, the caller's frame, strftime, the keys
merged per record) cost ~60 µs a request on the Lambda hot path; one dict and one orjson
call cost a tenth of that.

On Google Cloud (:func:`cloud_logging`) the same lines take Cloud Logging's special fields:
``severity`` for ``level`` and an RFC 3339 ``time`` for ``timestamp``, so the log viewer shows
each line's level and time (and its trace, which the GCP adapters add per request).
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
from typing import Any, TextIO

import orjson
from aws_lambda_powertools import Logger

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

FORMAT_ENV = "FNSERVE_LOG_FORMAT"  # json (what log pipelines read), or console (what a person reads)


class Readable(io.TextIOBase):
    """A stream that writes each JSON log line as a person reads it (the time, then the emulator console's form:
    level, message, the line's own keys); other text as it is."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        from fnserve.adapters.local.console import render

        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            shown = render(line)
            if shown is not None:
                self.out.write(f"{time.strftime('%H:%M:%S')} {shown}\n" if line.startswith("{") else shown + "\n")
        return len(text)

    def flush(self) -> None:
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
    """One INFO line like the logger's (its keys, the request's keys, then ``fields``), straight to its stream."""
    if logger.log_level > logging.INFO:
        return
    now = time.time()
    line: dict[str, Any] = {
        "level": "INFO",
        "location": "access",
        "message": message,
        "timestamp": f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(now))},{int(now % 1 * 1000):03d}+0000",
    }
    for key, value in logger.get_current_keys().items():
        if key not in line and value is not None and not (isinstance(value, str) and "%(" in value):
            line[key] = value  # service, and the Lambda context's keys; not the formatter's own specs
    trace = os.environ.get("_X_AMZN_TRACE_ID", "")
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
    text = orjson.dumps(line, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    handler.acquire()
    try:
        stream.write(text.decode())
        stream.flush()
    finally:
        handler.release()
