"""The emulator on a hand-written SAM template: SAM HttpApi (v2) and Api (v1) events, and the resolver."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from fnserve.aws import clients
from fnserve.core.errors import HandlerError
from fnserve.emulator.emulator import Emulator, Local
from fnserve.emulator.functions import collect
from fnserve.emulator.template import Resolver, load_template
from fnserve.workers.pool import FunctionSpec
from tests.moto import free_port
from tests.servers import wait_for

TEMPLATE = """
Transform: AWS::Serverless-2016-10-31
Parameters:
  Greeting:
    Type: String
    Default: hello
Conditions:
  Loud: !Equals [!Ref Greeting, HELLO]
Globals:
  Function:
    Runtime: python3.12
    Handler: app.handler
    Timeout: 5
    Layers: [!Ref SharedLayer]
    Environment:
      Variables:
        GREETING: !If [Loud, shouting, !Sub "${Greeting} from ${AWS::Region}"]
Resources:
  SharedLayer:
    Type: AWS::Serverless::LayerVersion
    Properties:
      ContentUri: shared
  ExtraLayer:
    Type: AWS::Serverless::LayerVersion
    Properties:
      ContentUri: extra
  Uploads:
    Type: AWS::S3::Bucket
  Hog:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: hog
      MemorySize: 256
      Events:
        Take:
          Type: HttpApi
          Properties:
            Path: /hog/{mb}
            Method: GET
  Echo:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: echo
      Layers: [!Ref ExtraLayer]  # after the Globals' SharedLayer, as SAM merges lists
      Events:
        Nightly:
          Type: Schedule
          Properties:
            Schedule: rate(1 day)
        Soon:
          Type: ScheduleV2
          Properties:
            ScheduleExpression: at(AT_SOON)
            Input: '{"job": "tidy"}'
        MonthEnd:
          Type: Schedule
          Properties:
            Schedule: cron(0 23 L * ? *)
        Uploaded:
          Type: S3
          Properties:
            Bucket: !Ref Uploads
            Events: s3:ObjectCreated:*
        V2:
          Type: HttpApi
          Properties:
            Path: /items/{id}
            Method: GET
        V1:
          Type: Api
          Properties:
            Path: /legacy/{proxy+}
            Method: POST
"""

APP = """
import base64, json, os, pathlib, time

import extra_words  # from ExtraLayer's python/lib/python3.12/site-packages
import shared_words  # from SharedLayer's python/


def handler(event, context):
    if "rawPath" not in event and "path" not in event:  # a schedule's event
        with (pathlib.Path(__file__).parent.parent / "scheduled.jsonl").open("a") as out:
            out.write(json.dumps(event) + "\\n")
        return {"scheduled": event}
    if "kaboom" in (event.get("rawPath") or event.get("path") or ""):
        raise ValueError("kaboom in handler, with a secret: hunter2")
    if "plain" in (event.get("rawPath") or event.get("path") or ""):
        return {"answer": 42}  # no statusCode
    if (event.get("rawPath") or "").endswith("/wait"):  # answers once the test creates the file "go"
        go = pathlib.Path(__file__).parent.parent / "go"
        while not go.exists():
            time.sleep(0.01)
    body = event.get("body")
    if body is not None and event.get("isBase64Encoded"):
        body = base64.b64decode(body).hex()
    answer = {
        "version": event.get("version", "1.0"),
        "params": event.get("pathParameters"),
        "method": event.get("httpMethod") or event["requestContext"]["http"]["method"],
        "body": body,
        "greeting": os.environ["GREETING"],
        "request_id": context.aws_request_id,
        "layers": [shared_words.WORD, extra_words.WORD],
    }
    headers = {"content-type": "application/json", "x-echo": "1"}
    return {"statusCode": 201, "headers": headers, "body": json.dumps(answer)}
"""


HOG = """
def handler(event, context):
    taken = b"x" * (int(event["pathParameters"]["mb"]) * 2**20)  # written, so resident
    return {"statusCode": 200, "body": str(len(taken))}
"""


def write_app(root: Path, app: str = APP) -> None:
    """The echo template, its functions' code and its layers' modules, in ``root``."""
    # Far enough ahead that a slow start (a busy machine) still has it to come: a time already past when the
    # emulator starts is skipped, as EventBridge skips the times it missed.
    soon = (datetime.now(UTC) + timedelta(seconds=12)).strftime("%Y-%m-%dT%H:%M:%S")
    (root / "template.yaml").write_text(TEMPLATE.replace("AT_SOON", soon))
    for folder, name, text in (
        ("echo", "app.py", app),
        ("hog", "app.py", HOG),
        ("shared/python", "shared_words.py", "WORD = 'shared'\n"),
        ("extra/python/lib/python3.12/site-packages", "extra_words.py", "WORD = 'extra'\n"),
    ):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_text(text)


class Console:
    """The emulator's console, recorded: what each function wrote (its log)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def started(self, spec: FunctionSpec, request_id: str) -> None:
        return None

    def output(self, spec: FunctionSpec, request_id: str | None, text: str) -> None:
        self.lines.append(text)

    def finished(self, *args: Any) -> None:
        return None


CONSOLE = Console()


@contextlib.contextmanager
def echo_emulator(
    root: Path, observer: Console | None = None, reload: bool = False
) -> Iterator[tuple[Emulator, Local, int]]:
    """The echo template's emulator, on its own embedded moto, running until the block ends."""
    write_app(root)
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("LOCALSTACK_HOST", raising=False)
        emulator = Emulator(root / "template.yaml", port=port, observer=observer, reload=reload)
        try:
            yield emulator, emulator.start(), port
        finally:
            emulator.stop()
            clients.reset()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with echo_emulator(tmp_path_factory.mktemp("sam"), CONSOLE) as (_, _, port):
        yield f"http://127.0.0.1:{port}"


def test_http_api_events_are_version_2(emulator: str) -> None:
    response = httpx.get(f"{emulator}/items/42", timeout=30)
    assert response.status_code == 201 and response.headers["x-echo"] == "1"
    doc = response.json()
    assert doc["version"] == "2.0" and doc["params"] == {"id": "42"} and doc["method"] == "GET"
    assert doc["greeting"] == "hello from us-east-1"
    assert doc["layers"] == ["shared", "extra"]  # both layers' python/ folders are importable
    assert httpx.post(f"{emulator}/items/42", timeout=30).status_code == 404  # GET only


def test_rest_api_events_are_version_1_with_binary_bodies(emulator: str) -> None:
    response = httpx.post(
        f"{emulator}/legacy/a/b", content=b"\x00\xff", headers={"content-type": "application/octet-stream"}, timeout=30
    )
    doc = response.json()
    assert doc["version"] == "1.0" and doc["params"] == {"proxy": "a/b"} and doc["method"] == "POST"
    assert doc["body"] == "00ff"


def test_the_resolver_follows_parameters_conditions_and_dynamic_references(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(TEMPLATE)
    template = load_template(tmp_path / "t.yaml")
    variables = template.document["Globals"]["Function"]["Environment"]["Variables"]
    assert Resolver(template, {}, {}).resolve(variables) == {"GREETING": "hello from us-east-1"}
    assert Resolver(template, {}, {}, {"Greeting": "HELLO"}).resolve(variables) == {"GREETING": "shouting"}
    resolver = Resolver(template, {"Q": "http://q"}, {("Q", "Arn"): "arn:q"})
    resolved = resolver.resolve(
        {"a": {"Ref": "AWS::NoValue"}, "b": {"Fn::GetAtt": ["Q", "Arn"]}, "c": {"Ref": "Q"}, "d": "{{resolve:ssm:x}}"}
    )
    assert resolved["b"] == "arn:q" and resolved["c"] == "http://q" and "a" not in resolved
    assert len(resolved["d"]) == 48 and resolved["d"] == resolver.resolve("{{resolve:secretsmanager:y}}")


def test_a_function_whose_init_fails_stops_the_emulator_with_its_error(tmp_path: Path) -> None:
    write_app(tmp_path, "raise ImportError('no module named torch')\n")
    port = free_port()
    before = set(multiprocessing.active_children())  # the module's emulator, still running
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("LOCALSTACK_HOST", raising=False)
        emulator = Emulator(tmp_path / "template.yaml", port=port)
        with pytest.raises(HandlerError, match="Echo cannot start: app.handler failed to initialise: .*no module"):
            emulator.start()
        clients.reset()
    assert set(multiprocessing.active_children()) <= before  # every worker it started has stopped


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/items/kaboom", 500, "Internal Server Error"),  # HTTP API
        ("POST", "/legacy/kaboom", 502, "Internal server error"),  # REST API
    ],
)
def test_a_handler_error_is_api_gateways_generic_answer_and_its_traceback_goes_to_the_console(
    emulator: str, method: str, path: str, status: int, message: str
) -> None:
    CONSOLE.lines.clear()
    response = httpx.request(method, f"{emulator}{path}", timeout=30)
    assert (response.status_code, response.json()) == (status, {"message": message})
    assert "hunter2" not in response.text  # the exception's text stays in the log

    # The worker writes it as the function's log, which reaches the console through its pipe.
    wait_for(lambda: any("ValueError: kaboom" in line for line in CONSOLE.lines[1:]), 10, "the traceback")
    seen_text = "\n".join(CONSOLE.lines)
    assert "[ERROR] ValueError: kaboom in handler" in seen_text and "Traceback (most recent call last)" in seen_text
    assert 'raise ValueError("kaboom in handler' in seen_text


def test_globals_merge_as_sam_merges_them_and_unemulated_events_are_named(tmp_path: Path) -> None:
    write_app(tmp_path)
    template = load_template(tmp_path / "template.yaml")
    app = collect(template, Resolver(template, {}, {}), tmp_path, 1)
    echo, hog = app.functions["Echo"], app.functions["Hog"]
    # Lists in Globals come before the function's own (SAM's translator), maps are merged.
    assert echo.paths == [
        str(tmp_path / "shared/python"),
        str(tmp_path / "extra/python/lib/python3.12/site-packages"),
        str(tmp_path / "extra/python"),
    ]
    assert hog.paths == [str(tmp_path / "shared/python")]
    assert echo.env["GREETING"] == hog.env["GREETING"] == "hello from us-east-1"
    assert (echo.memory_mb, hog.memory_mb, echo.timeout) == (128, 256, 5.0)
    assert app.warnings == [
        "function Echo: schedule MonthEnd does not run on a timer here (cron(0 23 L * ? *): 'L' is not emulated); "
        "POST /_fnserve/schedules/Echo/MonthEnd runs it",
        "function Echo: event Uploaded (S3) is not emulated; only HttpApi, Api, SQS, Schedule, ScheduleV2 events "
        "are. Deployed, it would invoke Echo.",
    ]
    assert [(s.event, s.kind, s.expression) for s in app.schedules][:1] == [("Nightly", "Schedule", "rate(1 day)")]


def test_a_globals_section_sam_refuses_is_refused_with_sams_message(tmp_path: Path) -> None:
    write_app(tmp_path)
    template = tmp_path / "template.yaml"
    template.write_text(template.read_text().replace("    Handler: app.handler\n", "    Handlr: app.handler\n", 1))
    with pytest.raises(ValueError, match="not a valid SAM template: 'Globals' section is invalid. 'Handlr' is not"):
        load_template(template)


def test_a_function_over_its_memory_size_is_stopped_as_lambda_stops_it(emulator: str) -> None:
    assert httpx.get(f"{emulator}/hog/1", timeout=30).text == str(2**20)
    CONSOLE.lines.clear()
    response = httpx.get(f"{emulator}/hog/400", timeout=30)  # 400 MB in a 256 MB function
    assert (response.status_code, response.json()) == (500, {"message": "Internal Server Error"})
    wait_for(lambda: any("Runtime.OutOfMemory" in line for line in CONSOLE.lines), 10, "the out-of-memory line")
    assert any("function Hog used" in line and "MemorySize of 256 MB" in line for line in CONSOLE.lines)
    assert httpx.get(f"{emulator}/hog/1", timeout=30).status_code == 200  # a fresh worker answers


@pytest.mark.parametrize(("path", "status"), [("/items/plain", 200), ("/legacy/plain", 502)])
def test_an_answer_without_status_code_is_a_body_for_an_http_api_and_malformed_for_a_rest_api(
    emulator: str, path: str, status: int
) -> None:
    method = "GET" if path.startswith("/items") else "POST"
    response = httpx.request(method, f"{emulator}{path}", timeout=30)
    assert response.status_code == status
    if status == 200:
        assert response.json() == {"answer": 42}


RESOURCES = """
Transform: AWS::Serverless-2016-10-31
Parameters:
  Visibility:
    Type: Number
    Default: 30
Resources:
  Dlq:
    Type: AWS::SQS::Queue
  Jobs:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: !Ref Visibility
      RedrivePolicy:
        deadLetterTargetArn: !GetAtt Dlq.Arn
        maxReceiveCount: 3
  Results:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: pk, AttributeType: S}]
      KeySchema: [{AttributeName: pk, KeyType: HASH}]
      TimeToLiveSpecification: {AttributeName: expires_at, Enabled: true}
  Payloads:
    Type: AWS::S3::Bucket
"""


def test_a_restart_against_the_same_endpoint_reuses_its_resources_and_their_data(tmp_path: Path) -> None:
    from tests.moto import aws_env, moto_server

    (tmp_path / "template.yaml").write_text(RESOURCES)
    with moto_server(tmp_path / "moto.log") as url, pytest.MonkeyPatch.context() as mp:
        for key, value in aws_env(url).items():  # an endpoint that outlives the emulator, as LocalStack does
            mp.setenv(key, value)
        mp.delenv("LOCALSTACK_HOST", raising=False)
        clients.reset()
        first = Emulator(tmp_path / "template.yaml", port=free_port())
        table = first.start().tables["Results"]
        clients.client("dynamodb").put_item(TableName=table, Item={"pk": {"S": "kept"}})
        first.stop()
        # Again, with a different visibility timeout: the queue is reused and takes the new one.
        second = Emulator(tmp_path / "template.yaml", port=free_port(), parameters={"Visibility": "45"})
        local = second.start()
        try:
            assert local.tables["Results"] == table
            assert clients.client("dynamodb").get_item(TableName=table, Key={"pk": {"S": "kept"}})["Item"]
            attrs = clients.client("sqs").get_queue_attributes(
                QueueUrl=local.queues["Jobs"], AttributeNames=["VisibilityTimeout", "RedrivePolicy"]
            )["Attributes"]
            assert attrs["VisibilityTimeout"] == "45" and "fnserve-local-Dlq" in attrs["RedrivePolicy"]
        finally:
            second.stop()
            clients.reset()


def test_the_banner_offers_the_templates_own_routes_not_the_demos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fnserve.emulator.local import banner

    with echo_emulator(tmp_path) as (emulator, local, port):
        capsys.readouterr()
        banner(emulator, local, f"http://127.0.0.1:{port}", 1)
    banner = capsys.readouterr().out
    assert "digits" not in banner and "fnserve submit" not in banner
    assert f"try   curl -s -X GET http://127.0.0.1:{port}/items/{{id}}" in banner
    nightly = next(line for line in banner.splitlines() if "timer rate(1 day) -> Echo (Nightly, next " in line)
    assert f"now: curl -s -X POST http://127.0.0.1:{port}/_fnserve/schedules/Echo/Nightly)" in nightly
    assert "timer cron(0 23 L * ? *) -> Echo (MonthEnd, on demand;" in banner


def test_the_emulator_shows_a_requests_spans_on_its_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_EXPORTER=console: the functions' spans appear in the console, in the caller's trace."""
    from tests.helpers import REPO

    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    for key, value in {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}.items():
        monkeypatch.setenv(key, value)  # the workers inherit it, as `OTEL_TRACES_EXPORTER=console make run` does
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("LOCALSTACK_HOST", raising=False)
    console = Console()
    port = free_port()
    emulator = Emulator(REPO / "template.yaml", port=port, observer=console, parameters={"ApiAuth": "NONE"})
    try:
        emulator.start()
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
        headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
        response = httpx.post(f"http://127.0.0.1:{port}/v2/models/digits-accurate/infer", json=body, headers=headers)
        assert response.status_code == 200, response.text

        def spans() -> str:
            return "\n".join(console.lines)

        wait_for(lambda: spans().count(f'"trace_id": "0x{trace_id}"') >= 4, 30, "the request's spans on the console")
        assert '"name": "POST /v2/models/{model_name}/infer"' in spans() and '"name": "decode"' in spans()
    finally:
        emulator.stop()
        clients.reset()


def test_the_emulator_serves_a_manifest_of_the_readers_own_in_place_of_the_models_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fnserve local --manifest (make run MANIFEST=...): every function reads that manifest, its models beside it."""
    from fnserve.core.models.writing import add_model
    from tests.helpers import DEMO_MANIFEST, REPO

    manifest = tmp_path / "my-models" / "manifest.toml"
    add_model(manifest, DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx", "my-model")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("LOCALSTACK_HOST", raising=False)
    port = free_port()
    emulator = Emulator(REPO / "template.yaml", port=port, parameters={"ApiAuth": "NONE"}, manifest=manifest)
    try:
        emulator.start()
        assert {spec.env.get("FNSERVE_MANIFEST") for spec in emulator.app.functions.values()} <= {str(manifest), None}
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
        url = f"http://127.0.0.1:{port}/v2/models"
        assert httpx.post(f"{url}/my-model/infer", json=body, timeout=30).status_code == 200
        assert httpx.post(f"{url}/digits-accurate/infer", json=body, timeout=30).status_code == 404  # the layer's
    finally:
        emulator.stop()
        clients.reset()


def test_reload_restarts_a_functions_workers_after_their_running_invocations(tmp_path: Path) -> None:
    import threading

    with echo_emulator(tmp_path, reload=True) as (emulator, _, port):
        url = f"http://127.0.0.1:{port}/items"
        assert httpx.get(f"{url}/1", timeout=30).json()["layers"] == ["shared", "extra"]
        pids = emulator.pools["Echo"].worker_pids()
        hog = emulator.pools["Hog"].worker_pids()
        running: dict[str, httpx.Response] = {}
        waiting = threading.Thread(target=lambda: running.update(r=httpx.get(f"{url}/wait", timeout=60)))
        waiting.start()
        wait_for(lambda: emulator.pools["Echo"].busy() == 1, 30, "the invocation to start")

        (tmp_path / "shared" / "python" / "shared_words.py").write_text("WORD = 'shared, changed'\n")  # a layer
        wait_for(lambda: emulator.pools["Echo"].recycles >= 1, 30, "the change to be seen")
        assert emulator.pools["Echo"].worker_pids() == pids  # still running the invocation it had
        (tmp_path / "go").touch()
        waiting.join(60)
        assert running["r"].status_code == 201 and running["r"].json()["layers"] == ["shared", "extra"]

        assert httpx.get(f"{url}/2", timeout=30).json()["layers"] == ["shared, changed", "extra"]  # new workers
        assert emulator.pools["Echo"].worker_pids() != pids
        # Hog uses the same layer: it was restarted too.
        wait_for(lambda: emulator.pools["Hog"].worker_pids() not in ([], hog), 30, "Hog's new worker")

        # Code that fails to import answers as a failed init does; fixed, the function answers again.
        (tmp_path / "echo" / "app.py").write_text("raise ImportError('half-saved')\n")
        wait_for(lambda: httpx.get(f"{url}/3", timeout=30).status_code >= 500, 30, "the broken code to load")
        (tmp_path / "echo" / "app.py").write_text(APP)
        wait_for(lambda: httpx.get(f"{url}/4", timeout=30).status_code == 201, 30, "the fixed code to load")


def test_schedules_fire_on_time_or_on_demand_with_eventbridges_event(tmp_path: Path) -> None:
    with echo_emulator(tmp_path) as (_, local, port):
        url = f"http://127.0.0.1:{port}/_fnserve/schedules"
        fired = tmp_path / "scheduled.jsonl"
        # Soon: a ScheduleV2 at(now + 12 s) with an Input: the function gets the Input, on time.
        wait_for(lambda: fired.exists() and '{"job": "tidy"}' in fired.read_text(), 60, "the at() schedule to fire")

        ran = httpx.post(f"{url}/Echo/Nightly", timeout=30)  # a daily rule, run now
        assert ran.status_code == 200, ran.text
        event = ran.json()["response"]["scheduled"]
        assert (event["detail-type"], event["source"], event["detail"]) == ("Scheduled Event", "aws.events", {})
        assert event["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/Echo-Nightly"]
        assert httpx.post(f"{url}/Echo/MonthEnd", timeout=30).status_code == 200  # no timer, but it runs
        missing = httpx.post(f"{url}/Echo/Weekly", timeout=30)
        assert missing.status_code == 404 and "Echo/Nightly" in missing.json()["error"]
        assert (
            "rate(1 day) -> Echo (Nightly)" in httpx.get(f"http://127.0.0.1:{port}/_fnserve/local").json()["schedules"]
        )
        assert len(fired.read_text().splitlines()) == 3  # at() once: it does not come back
