"""The emulator's console: Lambda's START/END/REPORT lines and readable function logs."""

from __future__ import annotations

import io
import json

from fnserve.aws.events import http_api_event, sqs_event
from fnserve.emulator.console import Console, render
from fnserve.workers.messages import Usage
from fnserve.workers.pool import FunctionSpec

SPEC = FunctionSpec("BatchFunction", "", memory_mb=2048)


def test_powertools_lines_show_level_message_and_their_own_keys() -> None:
    line = json.dumps(
        {
            "level": "WARNING",
            "location": "fail:85",
            "message": "job refused",
            "timestamp": "2026-11-22 16:44:56,526+0000",
            "service": "fnserve",
            "function_request_id": "r-1",
            "request_id": "r-1",
            "job": "p-1",
            "error": "Request for unknown model: 'nope' is not found",
        }
    )
    assert render(line) == "WARNING job refused  job=p-1 error=\"Request for unknown model: 'nope' is not found\""


def test_emf_blobs_are_one_metrics_line_and_plain_text_stays() -> None:
    emf = {
        "_aws": {"CloudWatchMetrics": [{"Namespace": "fnserve", "Metrics": [{"Name": "JobsDone"}, {"Name": "Lat"}]}]},
        "JobsDone": [9.0],
        "Lat": [1.5, 2.5],
    }
    assert render(json.dumps(emf)) == "metrics JobsDone=9 Lat=4"
    assert render("print() from a handler") == "print() from a handler"
    assert render("   ") is None


def test_an_invocation_reads_as_lambda_reports_it() -> None:
    out, raw = io.StringIO(), io.StringIO()
    console = Console(out, raw)
    event = sqs_event(["{}", "{}", "{}"])
    console.started(SPEC, "r-1")
    console.output(SPEC, "r-1", '{"level": "INFO", "message": "batch", "records": 3}')
    console.finished(
        SPEC, "r-1", event, {"batchItemFailures": [{"itemIdentifier": "msg-00001"}]}, None, Usage(41.2, 210, 812.4)
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "BatchFunction   START RequestId: r-1  Version: $LATEST"
    assert lines[1] == "BatchFunction     INFO    batch  records=3"
    assert lines[2] == "BatchFunction   END RequestId: r-1"
    assert lines[3] == (
        "BatchFunction   REPORT RequestId: r-1  Duration: 41.20 ms  Billed Duration: 42 ms  Memory Size: 2048 MB  "
        "Max Memory Used: 210 MB  Init Duration: 812.40 ms  SQS batch: 3 records, 1 failed"
    )
    assert raw.getvalue() == '{"level": "INFO", "message": "batch", "records": 3}\n'  # the raw line, untouched


def test_http_invocations_and_errors_say_what_happened() -> None:
    out = io.StringIO()
    api = FunctionSpec("ApiFunction", "", memory_mb=1024)
    event = http_api_event("POST", "/v2/models/digits/infer", route_key="ANY /v2/{proxy+}", headers={}, body=b"{}")
    Console(out).finished(api, "r-2", event, None, "function ApiFunction timed out after 3s", None)
    lines = out.getvalue().splitlines()
    assert lines[0] == "ApiFunction       ERROR   function ApiFunction timed out after 3s"
    assert lines[2] == "ApiFunction     REPORT RequestId: r-2  HTTP: POST /v2/models/digits/infer -> error"


def test_columns_hold_still_as_function_names_appear() -> None:
    """Told the template's function names at start, every line starts its text at one column."""
    out = io.StringIO()
    console = Console(out)
    console.expect(["fnserve", "ApiFunction", "FollowupProcessorFunction"])
    console.started(FunctionSpec("ApiFunction", "", memory_mb=2048), "r-1")
    console.started(FunctionSpec("FollowupProcessorFunction", "", memory_mb=2048), "r-2")
    starts = {line.index("START") for line in out.getvalue().splitlines()}
    assert starts == {len("FollowupProcessorFunction") + 2}
