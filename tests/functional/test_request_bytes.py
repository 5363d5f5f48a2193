"""The bytes a request leaves behind on AWS, which docs/aws-costs.md's worked totals price (``fnserve.bench.prices``):
the log lines the real API handler writes for one request to each demo model, the HTTP API's access-log line as
template.yaml formats it, and the DynamoDB item a cached result becomes. Each must stay within 10% of its figure in
prices.py; the failure prints the measured figure to put there."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from aws_lambda_powertools.logging.filters import SuppressFilter
from awslambdaric.lambda_runtime_log_utils import JsonFormatter
from cfnlint.decode.cfn_yaml import load

from fnserve.aws import clients as aws_clients
from fnserve.aws.events import LambdaContext
from fnserve.bench import prices
from fnserve.core.codec.tensors import pack_arrays
from fnserve.core.execution.cache import cache_key
from fnserve.core.models.datatypes import V2_TO_NUMPY
from fnserve.observability.logs import logger
from fnserve.stores.dynamodb import DynamoCacheBackend, DynamoResultStore
from tests.helpers import DEMO_MANIFEST, REPO, load_module
from tests.helpers.clouds import Aws

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
EVENTS = {"digits-accurate": "api-http-infer.json", "minilm-embed": "api-http-embed.json"}
FUNCTION = "fnserve-ApiFunction-Xq3kP9sL2mNb"  # as SAM names it: the stack, the logical id, 12 characters
TOLERANCE = 0.10
WARM_REQUESTS = 5
TEMPLATE = load(str(REPO / "template.yaml"))


@pytest.fixture(scope="module")
def handler() -> Handler:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
        for name in ("POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_SERVICE_NAME"):  # as the template sets them
            mp.setenv(name, "fnserve")
        mp.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
        mp.delenv("FNSERVE_RESULTS_TABLE", raising=False)
        return load_module(REPO / "functions" / "api" / "app.py", "fn_api_request_bytes").handler  # type: ignore[no-any-return]


def one_request(model: str) -> dict[str, Any]:
    """The model's API Gateway event cut to one row: one digit, or one sentence."""
    event = json.loads((REPO / "events" / EVENTS[model]).read_text())
    assert event["rawPath"] == f"/v2/models/{model}/infer"
    body = orjson.loads(event["body"])
    tensor = body["inputs"][0]
    tensor["data"] = tensor["data"][: math.prod(tensor["shape"][1:])]
    tensor["shape"] = [1, *tensor["shape"][1:]]
    event["body"] = orjson.dumps(body).decode()
    event["headers"]["content-length"] = str(len(event["body"]))
    return event


def context() -> LambdaContext:
    """An invocation's context as the deployed stack's would read: its function's name, through the alias."""
    ctx = LambdaContext(function_name=FUNCTION, memory_mb=prices.API_MEMORY_MB)
    ctx.invoked_function_arn += ":live"
    return ctx


class Invocation(logging.Filter):
    """What Lambda's runtime adds to each record it writes: the invocation's request id."""

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.aws_request_id = self.request_id
        return True


@contextlib.contextmanager
def writes(monkeypatch: pytest.MonkeyPatch, request_id: str) -> Iterator[io.StringIO]:
    """What the function writes while inside, as Lambda's Python runtime takes it with the template's
    ``LoggingConfig``: stdout and stderr (the EMF document), fnserve's logger's stream, and every other logger's
    records at the ``ApplicationLogLevel`` (the root logger's level), which the runtime's handler writes in its JSON
    format (Powertools' filter on it keeps fnserve's own lines from being written twice). With X-Ray active,
    Lambda sets the invocation's trace header, which the access line carries."""
    trace = f"Root=1-{secrets.token_hex(4)}-{secrets.token_hex(12)};Parent={secrets.token_hex(8)};Sampled=1"
    monkeypatch.setenv("_X_AMZN_TRACE_ID", trace)
    written = io.StringIO()
    stream = logger.registered_handler
    assert isinstance(stream, logging.StreamHandler)
    runtime = logging.StreamHandler(written)
    runtime.setFormatter(JsonFormatter())
    runtime.addFilter(SuppressFilter(logger.service))
    runtime.addFilter(Invocation(request_id))
    root = logging.getLogger()
    level = root.level
    config = TEMPLATE["Globals"]["Function"]["LoggingConfig"]
    assert config["LogFormat"] == "JSON"
    root.setLevel(config["ApplicationLogLevel"])
    root.addHandler(runtime)
    before = stream.setStream(written)
    try:
        with contextlib.redirect_stdout(written), contextlib.redirect_stderr(written):
            yield written
    finally:
        stream.setStream(before)
        root.removeHandler(runtime)
        root.setLevel(level)


def log_bytes(text: str) -> int:
    """The bytes CloudWatch Logs ingests of ``text``: each line an event, its message without the newline."""
    return sum(len(line.encode()) for line in text.splitlines() if line.strip())


def invoke(handler: Handler, event: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, Any]]:
    invocation = context()
    with writes(monkeypatch, invocation.aws_request_id) as written:
        response = handler(event, invocation)
    assert response["statusCode"] == 200, response["body"]
    return log_bytes(written.getvalue()), response


@pytest.mark.parametrize("model", list(prices.REQUESTS))
def test_the_function_writes_what_prices_says_a_request(
    handler: Handler, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    event = one_request(model)
    invoke(handler, event, monkeypatch)  # the model's load, once a container
    measured = [invoke(handler, event, monkeypatch)[0] for _ in range(WARM_REQUESTS)]
    mean = sum(measured) / len(measured)
    expected = prices.FUNCTION_LOG_BYTES[model]
    assert abs(mean - expected) <= TOLERANCE * expected, f"prices.FUNCTION_LOG_BYTES[{model!r}] = {round(mean)}"


def access_line(event: dict[str, Any], status: int, milliseconds: float) -> str:
    """The HTTP API stage's access-log line for ``event``: template.yaml's format, each variable from the event (or
    the answer's status and time); a variable without a value is logged as "-"."""
    stage = TEMPLATE["Resources"]["HttpApiStage"]["Properties"]["AccessLogSettings"]["Format"]
    request = event["requestContext"]
    latency = str(math.ceil(milliseconds))
    values = {
        "requestId": request["requestId"],
        "identity.sourceIp": request["http"]["sourceIp"],
        "httpMethod": request["http"]["method"],
        "path": request["http"]["path"],
        "status": str(status),
        "responseLatency": latency,
        "integrationLatency": latency,
        "error.message": "-",
    }
    used = re.findall(r"\$context\.([\w.]+)", stage)
    assert set(used) == set(values), f"the access log's format has changed: {used}"
    return re.sub(r"\$context\.([\w.]+)", lambda m: values[m.group(1)], stage)


def test_the_http_apis_access_line_is_what_prices_says(handler: Handler, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = []
    for model in prices.REQUESTS:
        event = one_request(model)
        started = time.perf_counter()
        _, response = invoke(handler, event, monkeypatch)
        lines.append(access_line(event, response["statusCode"], (time.perf_counter() - started) * 1e3))
    for line in lines:
        assert json.loads(line)["status"] == "200"  # the format renders to JSON, as the log's readers expect
        measured = log_bytes(line)
        expected = prices.HTTP_API_LOG_BYTES
        assert abs(measured - expected) <= TOLERANCE * expected, f"prices.HTTP_API_LOG_BYTES = {measured}"


def item_bytes(item: dict[str, dict[str, Any]]) -> int:
    """An item's size as DynamoDB bills it: each attribute's name, and its value (a string's UTF-8 bytes, binary's
    bytes, a number's significant digits two to a byte, and one byte)."""
    size = 0
    for name, typed in item.items():
        ((kind, value),) = typed.items()
        size += len(name.encode())
        if kind == "S":
            size += len(value.encode())
        elif kind == "B":
            size += len(value)
        else:
            assert kind == "N", kind
            digits = value.lstrip("-").replace(".", "").strip("0")
            size += math.ceil(len(digits) / 2) + 1
    return size


def outputs(response: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """A JSON answer's outputs as the arrays the service cached."""
    doc = orjson.loads(response["body"])
    return {o["name"]: np.array(o["data"], V2_TO_NUMPY[o["datatype"]]).reshape(o["shape"]) for o in doc["outputs"]}


@pytest.mark.parametrize("model", list(prices.REQUESTS))
def test_a_cached_result_is_the_item_prices_says(
    handler: Handler, model: str, aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, response = invoke(handler, one_request(model), monkeypatch)
    key = cache_key(model, "1", {}, None)  # a content hash, as every key is
    DynamoCacheBackend(DynamoResultStore(aws.table)).put_many({key: pack_arrays(outputs(response))}, ttl_seconds=3600)
    dynamodb = aws_clients.client("dynamodb")
    item = dynamodb.get_item(TableName=aws.table, Key={"pk": {"S": f"cache#{key}"}})["Item"]
    measured = item_bytes(item)
    expected = prices.CACHE_ITEM_BYTES[model]
    assert abs(measured - expected) <= TOLERANCE * expected, f"prices.CACHE_ITEM_BYTES[{model!r}] = {measured}"
    # What is billed: the write units of the item as stored.
    assert math.ceil(measured / 1024) == math.ceil(expected / 1024)


def test_item_bytes_counts_as_dynamodb_does() -> None:
    # "pk" + 4, "b" + 3 bytes, "n" + 123.45 (five significant digits: three bytes, and one).
    assert item_bytes({"pk": {"S": "abcd"}, "b": {"B": b"xyz"}, "n": {"N": "123.45"}}) == 6 + 4 + 5
