"""OpenTelemetry traces: one trace from an HTTP request through its cascade follow-up, and over gRPC; spans read
back from an OTLP collector with their semantic conventions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fnserve.adapters.keys import key_id
from fnserve.adapters.lambda_ import http as lambda_http
from fnserve.adapters.lambda_ import sqs as lambda_sqs
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.bootstrap import build_service
from fnserve.core.jobs.messages import job_message
from fnserve.observability import tracing
from fnserve.settings import Settings
from tests.helpers import DEMO_HOLDOUT, REPO, MemoryStore, close_main_loop, write_test_manifest
from tests.helpers.cascade import CORRECTED, SURE, app_client, follow_up, request
from tests.helpers.clouds import Aws, received_event
from tests.helpers.serving import serve_with_grpc, stop
from tests.otlp import Collector
from tests.servers import wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
TRACEPARENT_KEY = tracing.TRACEPARENT  # the message attribute's name


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter
    tracing.disable()


@pytest.fixture
def settings(aws: Aws, tmp_path: Path) -> Settings:
    """test_cascade's settings, without access lines."""
    return Settings(
        manifest=write_test_manifest(tmp_path, cascade=True),
        results_table=aws.table,
        results_bucket=aws.bucket,
        followup_queue_url=aws.queue_url,
        access_log=False,
    )


def api_event(model: str, rows: np.ndarray) -> dict[str, Any]:
    """The API function's sample event (HTTP API v2), asking ``model`` to infer ``rows``."""
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/v2/models/{model}/infer"
    tensor = {"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}
    event["body"] = json.dumps({"inputs": [tensor]})
    event["headers"]["content-length"] = str(len(event["body"]))
    return event


def hex_trace(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def test_a_request_and_its_follow_up_share_one_trace(spans: InMemorySpanExporter, settings: Settings) -> None:
    client = app_client(settings)
    traced = {"traceparent": TRACEPARENT}
    response = client.post("/v2/models/digits/infer", json=request([CORRECTED[0]]), headers=traced)
    assert response.json()["parameters"]["followup_status"] == "pending"
    assert follow_up(settings, 1) == {"batchItemFailures": []}

    finished = {s.name: s for s in spans.get_finished_spans()}
    served = finished["POST /v2/models/{model_name}/infer"]  # OpenTelemetry's "{method} {route}"
    assert hex_trace(served) == TRACE_ID and format(served.parent.span_id, "016x") == CALLER_SPAN  # type: ignore[union-attr]
    assert dict(served.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v2/models/{model_name}/infer",
        "url.path": "/v2/models/digits/infer",
        "http.response.status_code": 200,
        "fnserve.model": "digits",
        "fnserve.transport": "http",
    }
    children = [s for s in spans.get_finished_spans() if s.parent and s.parent.span_id == served.context.span_id]
    stages = [s for s in children if s.name != "process job"]  # the follow-up's span is its child too (below)
    assert [s.name for s in stages] == ["decode", "infer", "encode"]
    assert all(served.start_time <= s.start_time <= s.end_time <= served.end_time for s in stages)  # type: ignore[operator]

    job = finished["process job"]  # the follow-up, in the follow-up function: the same trace
    assert hex_trace(job) == TRACE_ID and job.parent is not None and job.parent.span_id == served.context.span_id
    batch = finished["process jobs"]
    assert [link.context.span_id for link in batch.links] == [served.context.span_id]
    for consumer in (job, batch):
        attributes = consumer.attributes or {}
        assert attributes["messaging.system"] == "aws_sqs" and attributes["messaging.operation.type"] == "process"


def test_an_untraced_request_starts_its_own_trace_and_a_refusal_is_an_error(
    spans: InMemorySpanExporter, settings: Settings
) -> None:
    client = app_client(settings)
    client.post("/v2/models/digits-accurate/infer", json=request([SURE[0]]))
    client.post("/v2/models/digits-accurate/infer", json={"inputs": []})
    ok, refused = [s for s in spans.get_finished_spans() if s.name == "POST /v2/models/{model_name}/infer"]
    assert ok.parent is None and hex_trace(ok) != TRACE_ID and ok.status.status_code.name == "UNSET"
    assert refused.attributes["http.response.status_code"] == 422  # type: ignore[index]
    assert refused.status.status_code.name == "ERROR" and "non-empty" in (refused.status.description or "")


def test_sagemaker_invocations_are_spans_of_their_own_route(spans: InMemorySpanExporter, settings: Settings) -> None:
    client = app_client(settings)
    target = {"x-amzn-sagemaker-target-model": "digits-accurate", "traceparent": TRACEPARENT}
    assert client.post("/invocations", json=request([SURE[0]]), headers=target).status_code == 200
    [served] = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert served.name == "POST /invocations" and hex_trace(served) == TRACE_ID
    attributes = served.attributes or {}
    assert attributes["http.route"] == attributes["url.path"] == "/invocations"
    assert attributes["fnserve.model"] == "digits-accurate" and attributes["http.response.status_code"] == 200


def test_without_configuration_nothing_is_traced_and_follow_ups_carry_no_trace(settings: Settings, aws: Aws) -> None:
    assert not tracing.configure()  # no OTEL_* variables here
    client = app_client(settings)
    client.post("/v2/models/digits/infer", json=request([CORRECTED[0]]), headers={"traceparent": TRACEPARENT})
    record = received_event(aws, 1)["Records"][0]
    assert record["messageAttributes"] == {}


@pytest.fixture
def collector() -> Iterator[Collector]:
    received = Collector()
    yield received
    received.close()


KEY = "fns-traced-0123456789abcdef"
HTTP_SPAN = "POST /v2/models/{model_name}/infer"  # OpenTelemetry's "{method} {route}"
GRPC_SPAN = "inference.GRPCInferenceService/ModelInfer"  # and "{rpc.service}/{rpc.method}"
SERVER, CONSUMER = 2, 5  # OTLP's span kinds


def test_the_server_exports_http_and_grpc_spans_to_an_otlp_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)  # its processes inherit it
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fnserve-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("FNSERVE_API_KEYS", KEY)  # each span names the caller's key by its id
    served = serve_with_grpc(tmp_path, ("--processes", "1", "--workers", "0"))
    try:
        import httpx

        x = np.load(DEMO_HOLDOUT)["input"][:1]
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}
        grpc_trace = "0af7651916cd43dd8448eb211c80319c"
        keyed = {"authorization": f"Bearer {KEY}"}
        httpx.post(
            f"{served.url}/v2/models/digits-accurate/infer", json=body, headers={"traceparent": TRACEPARENT, **keyed}
        )
        client = triton.InferenceServerClient(served.address)
        inp = triton.InferInput("input", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        client.infer("digits-accurate", [inp], headers={"traceparent": f"00-{grpc_trace}-b7ad6b7169203331-01", **keyed})
        client.close()

        def traces() -> dict[str, set[str]]:
            found: dict[str, set[str]] = {}
            for span in collector.spans():
                found.setdefault(span.trace_id, set()).add(span.name)
            return found

        stages = {"decode", "infer", "encode"}
        wait_for(
            lambda: (
                {HTTP_SPAN, *stages} <= traces().get(TRACE_ID, set())
                and {GRPC_SPAN, *stages} <= traces().get(grpc_trace, set())
            ),
            30,
            "both requests' spans at the collector",
        )
    finally:
        stop(served)
    [http] = collector.named(HTTP_SPAN)
    assert (http.trace_id, http.parent_span_id, http.kind) == (TRACE_ID, CALLER_SPAN, SERVER)
    assert http.attributes == {
        "http.request.method": "POST",
        "http.route": "/v2/models/{model_name}/infer",
        "url.path": "/v2/models/digits-accurate/infer",
        "http.response.status_code": 200,
        "fnserve.model": "digits-accurate",
        "fnserve.transport": "http",
        "fnserve.api_key_id": key_id(KEY),
    }
    [rpc] = collector.named(GRPC_SPAN)
    assert (rpc.trace_id, rpc.parent_span_id, rpc.kind) == (grpc_trace, "b7ad6b7169203331", SERVER)
    assert rpc.attributes == {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "rpc.grpc.status_code": 0,
        "fnserve.model": "digits-accurate",
        "fnserve.transport": "grpc",
        "fnserve.api_key_id": key_id(KEY),
    }
    for span in (http, rpc):
        assert span.resource["service.name"] == "fnserve-test" and span.resource["telemetry.sdk.language"] == "python"
        assert not any(key.startswith(("faas.", "cloud.")) for key in span.resource)  # not on a cloud's functions


def test_lambda_functions_export_their_spans_before_each_invocation_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: Collector
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # no timed export: what arrives, the invocation sent
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    for variable, value in {
        "AWS_LAMBDA_FUNCTION_NAME": "fnserve-batch",
        "AWS_REGION": "eu-west-1",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
    }.items():
        monkeypatch.setenv(variable, value)
    settings = Settings(manifest=str(write_test_manifest(tmp_path)))
    service = build_service(settings)
    try:
        batch = lambda_sqs.create_handler(service=service, settings=settings, store=MemoryStore())
        rows = np.load(DEMO_HOLDOUT)["input"][:1]
        event = sqs_event([json.dumps(job_message("j1", "digits-accurate", {"input": rows}))])
        event["Records"][0]["messageAttributes"] = {TRACEPARENT_KEY: {"stringValue": TRACEPARENT, "dataType": "String"}}
        assert batch(event, LambdaContext()) == {"batchItemFailures": []}
        spans = {span.name: span for span in collector.spans()}  # no waiting: they left before it returned
        job, jobs = spans["process job"], spans["process jobs"]
        assert (job.trace_id, job.parent_span_id, job.kind, jobs.kind) == (TRACE_ID, CALLER_SPAN, CONSUMER, CONSUMER)
        assert job.attributes == {
            "messaging.system": "aws_sqs",
            "messaging.operation.type": "process",
            "messaging.message.id": "msg-00000",
        }
        assert jobs.attributes == {
            "messaging.system": "aws_sqs",
            "messaging.operation.type": "process",
            "messaging.batch.message_count": 1,
        }
        assert {key: job.resource.get(key) for key in ("service.name", "cloud.provider", "cloud.platform")} == {
            "service.name": "fnserve-batch",  # the function's name, without OTEL_SERVICE_NAME
            "cloud.provider": "aws",
            "cloud.platform": "aws_lambda",
        }
        assert (job.resource["faas.name"], job.resource["cloud.region"]) == ("fnserve-batch", "eu-west-1")

        api = lambda_http.create_handler(service=service, settings=settings)
        request_event = api_event("digits-accurate", rows)
        request_event["headers"]["traceparent"] = TRACEPARENT
        assert api(request_event, LambdaContext())["statusCode"] == 200
        close_main_loop()  # Mangum's, before another test's asyncio.run leaves it to the collector
        [served] = collector.named(HTTP_SPAN)
        assert (served.trace_id, served.parent_span_id, served.kind) == (TRACE_ID, CALLER_SPAN, SERVER)
        assert served.attributes["http.route"] == "/v2/models/{model_name}/infer"
        assert served.attributes["url.path"] == "/v2/models/digits-accurate/infer"
        assert served.attributes["http.response.status_code"] == 200
        assert {"decode", "infer", "encode"} <= {span.name for span in collector.spans() if span.trace_id == TRACE_ID}
    finally:
        tracing.disable()


def test_in_lambda_a_follow_up_carries_the_x_ray_trace_header(
    settings: Settings, aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    monkeypatch.setenv("_X_AMZN_TRACE_ID", header)  # what Lambda sets with X-Ray tracing on
    app_client(settings).post("/v2/models/digits/infer", json=request([CORRECTED[0]]))
    record = received_event(aws, 1)["Records"][0]
    assert record["attributes"]["AWSTraceHeader"] == header


def test_on_lambda_and_cloud_functions_the_resource_says_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AWS_LAMBDA_FUNCTION_NAME", "K_SERVICE", "FUNCTION_TARGET"):
        monkeypatch.delenv(variable, raising=False)
    assert tracing.platform_attributes() == {}
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "fnserve-api")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_VERSION", "7")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "2048")
    monkeypatch.setenv("AWS_LAMBDA_LOG_STREAM_NAME", "2026/11/25/[7]abc")
    assert tracing.platform_attributes() == {
        "cloud.provider": "aws",
        "cloud.platform": "aws_lambda",
        "cloud.region": "eu-west-1",
        "faas.name": "fnserve-api",
        "faas.version": "7",
        "faas.instance": "2026/11/25/[7]abc",
        "faas.max_memory": 2048 * 2**20,
    }
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME")
    monkeypatch.setenv("K_SERVICE", "fnserve-infer")
    monkeypatch.setenv("K_REVISION", "fnserve-infer-00003")
    monkeypatch.setenv("FUNCTION_TARGET", "infer")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    assert tracing.platform_attributes() == {
        "cloud.provider": "gcp",
        "cloud.platform": "gcp_cloud_functions",
        "cloud.account.id": "proj",
        "faas.name": "fnserve-infer",
        "faas.version": "fnserve-infer-00003",
    }
