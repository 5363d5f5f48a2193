"""OpenTelemetry traces: one trace from an HTTP request through its cascade follow-up, and over gRPC."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fnserve import tracing
from fnserve.settings import Settings
from tests.functional.conftest import Aws, serve_with_grpc, stop, wait_for
from tests.functional.test_batch import received_event
from tests.functional.test_cascade import CORRECTED, SURE, app_client, follow_up, request
from tests.helpers import DEMO_HOLDOUT, write_test_manifest

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


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


def test_the_server_exports_spans_for_http_and_grpc_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The console exporter, as for the emulator: spans as JSON on the server's stdout.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    served = serve_with_grpc(tmp_path, ("--processes", "1", "--workers", "0"))
    try:
        import httpx

        x = np.load(DEMO_HOLDOUT)["input"][:1]
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}
        grpc_trace = "0af7651916cd43dd8448eb211c80319c"
        httpx.post(f"{served.url}/v2/models/digits-accurate/infer", json=body, headers={"traceparent": TRACEPARENT})
        client = triton.InferenceServerClient(served.address)
        inp = triton.InferInput("input", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        client.infer("digits-accurate", [inp], headers={"traceparent": f"00-{grpc_trace}-b7ad6b7169203331-01"})
        client.close()

        def exported_spans() -> list[dict[str, Any]]:
            spans = []
            for chunk in served.log.read_text().split("\n}\n"):
                start = chunk.find('{\n    "name"')
                if start >= 0:
                    spans.append(json.loads(chunk[start:] + "\n}"))
            return spans

        def exported() -> dict[str, set[str]]:
            found: dict[str, set[str]] = {}
            for span in exported_spans():
                found.setdefault(span["context"]["trace_id"].removeprefix("0x"), set()).add(span["name"])
            return found

        wait_for(lambda: {TRACE_ID, grpc_trace} <= exported().keys(), 30, "both traces on the server's stdout")
        assert {"POST /v2/models/{model_name}/infer", "decode", "infer", "encode"} <= exported()[TRACE_ID]
        grpc_span = "inference.GRPCInferenceService/ModelInfer"  # OpenTelemetry's "{rpc.service}/{rpc.method}"
        assert {grpc_span, "decode", "infer", "encode"} <= exported()[grpc_trace]
        attributes = next(span["attributes"] for span in exported_spans() if span["name"] == grpc_span)
        assert attributes["rpc.system"] == "grpc" and attributes["rpc.method"] == "ModelInfer"
        assert attributes["rpc.service"] == "inference.GRPCInferenceService" and attributes["rpc.grpc.status_code"] == 0
    finally:
        stop(served)
    assert os.environ["OTEL_TRACES_EXPORTER"] == "console"


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
