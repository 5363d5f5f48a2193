"""The HTTP function's handler (functions/api/app.py) fed every event in events/."""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import openai
import orjson
import pytest

from fnserve.aws.events import LambdaContext
from tests.embeddings import LambdaTransport, check_client
from tests.helpers import BAD_NUMBERS, DEMO_MANIFEST, REPO
from tests.helpers.clouds import Aws
from tests.helpers.functions import load_function

# The deployed API's events, and those of integrations the handler also accepts (REST API, ALB).
EVENTS = sorted([*(REPO / "events").glob("api-*.json"), *(REPO / "tests" / "events").glob("api-*.json")])
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@pytest.fixture(scope="module")
def handler() -> Handler:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
        mp.setenv("POWERTOOLS_METRICS_NAMESPACE", "fnserve")
        return load_function(REPO / "functions" / "api" / "app.py").handler  # type: ignore[no-any-return]


def request_of(event: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = event.get("body") or ""
    raw = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()
    return raw, {k.lower(): v for k, v in (event.get("headers") or {}).items()}


def inputs_of(raw: bytes, headers: dict[str, str]) -> np.ndarray:
    if "inference-header-content-length" in headers:
        head = int(headers["inference-header-content-length"])
        tensor = orjson.loads(raw[:head])["inputs"][0]
        return np.frombuffer(raw[head:], "<f4").reshape(tensor["shape"])
    tensor = orjson.loads(raw)["inputs"][0]
    return np.array(tensor["data"], np.float32).reshape(tensor["shape"])


def outputs_of(response: dict[str, Any]) -> dict[str, np.ndarray]:
    body = response["body"]
    raw = base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()
    headers = {k.lower(): v for k, v in response.get("headers", {}).items()}
    if "inference-header-content-length" not in headers:
        return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in orjson.loads(raw)["outputs"]}
    head = int(headers["inference-header-content-length"])
    offset, out = head, {}
    for o in orjson.loads(raw[:head])["outputs"]:
        size = o["parameters"]["binary_data_size"]
        dtype = {"INT64": "<i8", "FP32": "<f4"}[o["datatype"]]
        out[o["name"]] = np.frombuffer(raw[offset : offset + size], dtype).reshape(o["shape"])
        offset += size
    assert offset == len(raw)
    return out


def test_every_event_type_is_covered() -> None:
    names = {p.name for p in EVENTS}
    assert {"api-http-infer.json", "api-rest-infer.json", "api-alb-infer.json"} <= names
    assert {"api-http-infer-binary.json", "api-rest-infer-binary.json"} <= names


def test_the_pipeline_events_give_their_answers(handler: Handler) -> None:
    text = handler(json.loads((REPO / "events" / "api-http-embed.json").read_text()), LambdaContext())
    assert text["statusCode"] == 200, text["body"]
    embedding = outputs_of(text)["embedding"]
    assert embedding.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)
    image = handler(json.loads((REPO / "events" / "api-http-image.json").read_text()), LambdaContext())
    assert image["statusCode"] == 200, image["body"]
    doc = orjson.loads(image["body"])
    outputs = {o["name"]: o["data"] for o in doc["outputs"]}
    assert outputs["label"] == [7] and outputs["labels"][0] == "seven"  # examples/digit-7.png


@pytest.mark.parametrize("path", [p for p in EVENTS if "infer" in p.name], ids=lambda p: p.name)
def test_infer_events_give_the_models_predictions(handler: Handler, path: Path) -> None:
    event = json.loads(path.read_text())
    response = handler(event, LambdaContext())
    assert response["statusCode"] == 200, response["body"]
    raw, headers = request_of(event)
    x = inputs_of(raw, headers)
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))
    label, probabilities = session.run(["label", "probabilities"], {"input": x})
    out = outputs_of(response)
    np.testing.assert_array_equal(out["label"], label)
    np.testing.assert_allclose(out["probabilities"], probabilities, rtol=1e-6)
    binary = "inference-header-content-length" in headers
    # Binary responses travel base64-encoded through API Gateway and come out as bytes.
    assert response["isBase64Encoded"] is binary


def test_metadata_event(handler: Handler) -> None:
    event = json.loads((REPO / "events" / "api-http-metadata.json").read_text())
    response = handler(event, LambdaContext())
    assert response["statusCode"] == 200
    assert json.loads(response["body"])["name"] == "digits-accurate"


def test_errors_are_json_with_status(handler: Handler) -> None:
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    event["body"] = '{"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}'
    response = handler(event, LambdaContext())
    assert response["statusCode"] == 422
    assert "must have 64 at axis 1" in json.loads(response["body"])["error"]
    event["body"] = "{"
    assert handler(event, LambdaContext())["statusCode"] == 400


@pytest.mark.parametrize(("body", "reason"), BAD_NUMBERS, ids=lambda v: str(v)[60:90])
def test_numbers_a_tensor_cannot_hold_are_a_422(handler: Handler, body: str, reason: str) -> None:
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    event["body"] = body
    response = handler(event, LambdaContext())
    assert response["statusCode"] == 422, response["body"]
    assert reason in json.loads(response["body"])["error"]


def _set_header(event: dict[str, Any], name: str, value: str) -> None:
    for field in ("headers", "multiValueHeaders"):
        headers = event.get(field)
        if headers:
            for key in [k for k in headers if k.lower() == name]:
                del headers[key]
            headers[name] = [value] if field == "multiValueHeaders" else value


@pytest.mark.parametrize("source", ["api-http-infer.json", "api-rest-infer.json", "api-alb-infer.json"])
@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("host", "a:b:c"),
        ("host", "example.com:abc"),
        ("host", "[::1]:443"),
        ("host", "[2001:db8::1]"),
        ("host", "example.com:"),
        ("x-forwarded-port", "abc"),
    ],
)
def test_any_host_header_is_answered(handler: Handler, source: str, header: str, value: str) -> None:
    event = json.loads(next(p for p in EVENTS if p.name == source).read_text())
    _set_header(event, header, value)
    response = handler(event, LambdaContext())
    assert response["statusCode"] == 200, response.get("body")
    assert outputs_of(response)["label"].ndim == 1


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("example.com", None, ("example.com", 443)),
        ("example.com:8080", None, ("example.com", 8080)),
        ("example.com:abc", "8443", ("example.com", 8443)),
        ("a:b:c", None, ("a:b", 443)),
        ("[::1]:8080", None, ("::1", 8080)),
        ("[::1]", "80", ("::1", 80)),
    ],
)
def test_the_server_is_read_from_any_host_as_rfc_3986_does(
    host: str, port: str | None, server: tuple[str, int]
) -> None:
    from fnserve.adapters.lambda_.asgi import _server

    assert _server(host, port, "https") == server


def _log_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_logs_and_emf_metrics_carry_the_request(
    handler: Handler, capsys: pytest.CaptureFixture[str], log_stream: io.StringIO
) -> None:
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    capsys.readouterr()
    response = handler(event, LambdaContext(request_id="lambda-req-1"))
    logs = _log_lines(log_stream.getvalue())
    emf = _log_lines(capsys.readouterr().out)
    assert logs, "no structured log line"
    assert all(line["function_request_id"] == "lambda-req-1" for line in logs)
    assert all(line["request_id"] == "lambda-req-1" for line in logs)
    assert response["headers"]["x-request-id"] == "lambda-req-1"
    inference = next(line for line in logs if line["message"] == "inference")
    assert inference["model"] == "digits-accurate" and {"decode", "infer", "encode"} <= set(inference)
    assert inference["level"] == "INFO" and inference["service"] == "fnserve" and inference["timestamp"]
    assert len(emf) == 1
    blob = emf[0]
    assert blob["model"] == "digits-accurate" and blob["status"] == "200" and blob["Requests"] == 1.0
    directive = blob["_aws"]["CloudWatchMetrics"][0]
    # A valid EMF document: every dimension and every metric is a member of the root.
    assert directive["Namespace"] and all(key in blob for key in directive["Dimensions"][0])
    assert all(isinstance(blob[m["Name"]], float) for m in directive["Metrics"])
    names = {m["Name"] for m in directive["Metrics"]}
    assert {"Requests", "Latency", "DecodeLatency", "InferLatency", "EncodeLatency"} <= names
    assert "Errors" not in names


def test_the_api_key_authorizers_key_id_joins_the_invocations_lines_and_not_the_next(
    handler: Handler, log_stream: io.StringIO
) -> None:
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    keyed = {**event, "requestContext": {**event["requestContext"], "authorizer": {"lambda": {"keyId": "1a2b3c4d"}}}}
    handler(keyed, LambdaContext(request_id="keyed"))
    handler(event, LambdaContext(request_id="unkeyed"))
    lines = [line for line in _log_lines(log_stream.getvalue()) if line["message"] == "inference"]
    assert [(line["request_id"], line.get("api_key_id")) for line in lines] == [
        ("keyed", "1a2b3c4d"),
        ("unkeyed", None),
    ]


def test_powertools_log_level_and_metrics_switch_take_effect_in_the_api_function(
    capsys: pytest.CaptureFixture[str], log_stream: io.StringIO
) -> None:
    from fnserve.observability.logs import logger

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
        mp.delenv("FNSERVE_LOG_LEVEL", raising=False)
        mp.setenv("POWERTOOLS_LOG_LEVEL", "DEBUG")
        mp.setenv("POWERTOOLS_METRICS_DISABLED", "true")
        quiet = load_function(REPO / "functions" / "api" / "app.py").handler
    try:
        assert logger.log_level == logging.DEBUG
        event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
        capsys.readouterr()
        assert quiet(event, LambdaContext())["statusCode"] == 200
        assert not [line for line in _log_lines(capsys.readouterr().out) if "_aws" in line]  # no EMF metrics
    finally:
        logger.setLevel("INFO")
    with pytest.MonkeyPatch.context() as mp:  # fnserve's own setting, when given, wins
        mp.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
        mp.setenv("FNSERVE_LOG_LEVEL", "WARNING")
        mp.setenv("POWERTOOLS_LOG_LEVEL", "DEBUG")
        load_function(REPO / "functions" / "api" / "app.py")
    try:
        assert logger.log_level == logging.WARNING
    finally:
        logger.setLevel("INFO")


def test_error_requests_count_as_errors(handler: Handler, capsys: pytest.CaptureFixture[str]) -> None:
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    event["body"] = "{"
    capsys.readouterr()
    handler(event, LambdaContext())
    emf = [line for line in _log_lines(capsys.readouterr().out) if "_aws" in line]
    assert len(emf) == 1 and emf[0]["status"] == "400"
    assert "Errors" in {m["Name"] for m in emf[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}


def test_binary_response_is_base64_only_for_binary(handler: Handler) -> None:
    event = json.loads((REPO / "events" / "api-http-infer-binary.json").read_text())
    response = handler(event, LambdaContext())
    raw = base64.b64decode(response["body"])
    head = int(response["headers"]["inference-header-content-length"])
    doc = orjson.loads(raw[:head])
    assert [o["parameters"]["binary_data_size"] for o in doc["outputs"]] == [4 * 8, 4 * 10 * 4]
    assert struct.calcsize("<q") == 8


COLD_PATH = """
import json, sys
sys.path.insert(0, {function!r})
import app
{call}
watched = ("fastapi", "starlette", "pydantic", "pydantic_settings", "boto3", "asyncio")
watched += ("fnserve.core.batching.scheduler", "fnserve.core.jobs.processor")
print(json.dumps(sorted(m for m in watched if m in sys.modules)))
"""
API_CALL = """
from fnserve.aws.events import LambdaContext
event = json.load(open({event!r}))
assert app.handler(event, LambdaContext())["statusCode"] == 200
"""


@pytest.mark.parametrize(
    ("function", "call", "loaded"),
    [
        # The API function's first inference answers before FastAPI or pydantic is imported (a large share of a
        # cold start); the first other request builds it.
        ("api", API_CALL.format(event=str(REPO / "events" / "api-http-infer.json")), ["asyncio"]),
        (
            "api",
            API_CALL.format(event=str(REPO / "events" / "api-http-metadata.json")),
            ["asyncio", "fastapi", "pydantic", "starlette"],
        ),
        # The batch function's init needs no FastAPI, no asyncio (it has no event loop) and no boto3
        # (its clients are made on first use). Only it has the job processor, and neither has the batcher.
        ("batch", "", ["fnserve.core.jobs.processor"]),
    ],
)
def test_cold_paths_import_only_what_they_need(function: str, call: str, loaded: list[str]) -> None:
    import subprocess
    import sys

    env = {
        "FNSERVE_MANIFEST": str(DEMO_MANIFEST),
        "FNSERVE_RESULTS_TABLE": "results" if function == "batch" else "",
        "PATH": "/usr/bin:/bin",
    }
    env = {k: v for k, v in env.items() if v}
    code = COLD_PATH.format(function=str(REPO / "functions" / function), call=call)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == loaded


def test_with_x_ray_every_log_line_carries_the_trace_id(
    handler: Handler, log_stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    handler(event, LambdaContext(request_id="lambda-req-2"))
    bad = copy.deepcopy(event)
    bad["body"] = "{"
    bad.pop("isBase64Encoded", None)
    handler(bad, LambdaContext(request_id="lambda-req-3"))
    logs = _log_lines(log_stream.getvalue())
    assert {line["message"] for line in logs} >= {"inference", "inference refused"}
    assert all(line["xray_trace_id"] == "1-5759e988-bd862e3fe1be46a994272793" for line in logs), logs


POWERTOOLS_CALL = """
import json, sys
sys.path.insert(0, {function!r})
import app
from fnserve.aws.events import LambdaContext
print("---")
app.handler(json.load(open({event!r})), LambdaContext())
"""


@pytest.mark.parametrize(("function", "event"), [("api", "api-http-infer.json"), ("batch", "batch-jobs.json")])
def test_the_templates_powertools_service_and_namespace_are_honoured(function: str, event: str, aws: Aws) -> None:
    import os
    import subprocess
    import sys

    env = {
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},  # the moto server
        "FNSERVE_MANIFEST": str(DEMO_MANIFEST),
        "PATH": "/usr/bin:/bin",
        "POWERTOOLS_SERVICE_NAME": "digits-svc",
        "POWERTOOLS_METRICS_NAMESPACE": "DigitsTeam",
    }
    if function == "batch":
        env["FNSERVE_RESULTS_TABLE"] = aws.table
    code = POWERTOOLS_CALL.format(function=str(REPO / "functions" / function), event=str(REPO / "events" / event))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    lines = _log_lines(done.stdout.split("---", 1)[1])
    logs = [line for line in lines if "level" in line]
    emf = [line for line in lines if "_aws" in line]
    assert logs and all(line["service"] == "digits-svc" for line in logs), done.stdout + done.stderr
    assert emf and all(line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "DigitsTeam" for line in emf)
    assert all(line["service"] == "digits-svc" for line in emf)


@pytest.mark.parametrize("version", ["2.0", "1.0"])
def test_the_openai_client_through_api_gateway_events(handler: Handler, version: str) -> None:
    """OpenAI's embeddings API in the API function: the official client's own requests, as API Gateway's HTTP API
    (payload 2.0) and REST API (1.0) hand them to the function."""
    transport = LambdaTransport(handler, version)
    with (
        httpx.Client(transport=transport, base_url="https://api.example") as http,
        openai.OpenAI(base_url="https://api.example/v1", api_key="unused", http_client=http) as client,
    ):
        check_client(client, http)
