"""Adaptive batching in the server's app: concurrent requests, one runtime call, each its own answer."""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from msgspec import ValidationError
from prometheus_client.parser import text_string_to_metric_families

from fnserve.adapters.http.app import create_app
from fnserve.adapters.http.wire import SEND_NOW
from fnserve.core.batching.scheduler import AdaptiveBatcher
from fnserve.core.codec.tensors import InferenceRequest
from fnserve.core.errors import FnserveError, InvalidInput
from fnserve.core.execution.cache import ResultCache
from fnserve.core.execution.service import InferenceService
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.serving.dataplane import Answer, DataPlane
from fnserve.observability.metrics import ServerMetrics
from fnserve.settings import Settings
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, Arrived, body_never_comes, post_scope, write_test_manifest

DIGITS = np.load(DEMO_HOLDOUT)["input"]


def test_concurrent_requests_are_batched_and_answered_alone(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    manifest.write_text(
        manifest.read_text().replace('name = "digits-accurate"\n', 'name = "digits-accurate"\nmax_batch_time_ms = 30\n')
    )
    service = InferenceService.from_manifest(manifest, eager=True)
    plane = DataPlane(service, batching=True)
    assert list(plane.batchers) == ["digits-accurate"]
    app = create_app(plane, Settings(manifest=manifest, access_log=False))

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
            requests = []
            for i in range(24):
                x = DIGITS[i : i + 1 + i % 2]
                body = {
                    "inputs": [
                        {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
                    ]
                }
                if i == 5:
                    body["inputs"][0]["shape"] = [x.shape[0], 32]  # a bad request among them
                    body["inputs"][0]["data"] = [0.0] * (x.shape[0] * 32)
                requests.append(client.post("/v2/models/digits-accurate/infer", json=body))
            return await asyncio.gather(*requests)

    responses = asyncio.run(main())
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))
    for i, response in enumerate(responses):
        if i == 5:
            assert response.status_code == 422  # refused alone, before it could join a batch
            continue
        assert response.status_code == 200, response.text
        expected = session.run(["label"], {"input": DIGITS[i : i + 1 + i % 2]})[0].tolist()
        assert response.json()["outputs"][0]["data"] == expected
        assert "queue;dur=" in response.headers["server-timing"]
    assert plane.batchers["digits-accurate"].batches < 23  # fewer runtime calls than requests


class Recorded:
    """A transport's recorder that keeps how each request ended: 200 and its timings, or the refusal's status."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, dict[str, float]]] = []

    def start(self, name: str, version: str | None, traceparent: str | None) -> Recorded:
        return self

    def served(self, answer: Answer, timings: dict[str, float]) -> None:
        self.ended.append((200, timings))

    def refused(self, error: FnserveError) -> None:
        self.ended.append((error.status_code, {}))

    def cancelled(self, reason: str) -> None:
        raise AssertionError(f"no request was cancelled: {reason}")


def test_a_batched_models_answers_are_encoded_in_its_batchs_thread_and_an_error_there_is_its_request_s(
    tmp_path: Path,
) -> None:
    """Each answer of a batch is finished and encoded in the thread that ran the batch, not on the event loop (which
    keeps reading and refusing requests meanwhile); an encoding that fails fails its own request, not the batch."""
    manifest = write_test_manifest(tmp_path)
    manifest.write_text(
        manifest.read_text().replace('name = "digits-accurate"\n', 'name = "digits-accurate"\nmax_batch_time_ms = 50\n')
    )
    plane = DataPlane(InferenceService.from_manifest(manifest, eager=True), batching=True)
    batcher = plane.batchers["digits-accurate"]
    recorder = Recorded()
    threads: list[str] = []

    def encode(answer: Answer, request: InferenceRequest) -> list[int]:
        threads.append(threading.current_thread().name)
        if request.inputs["input"][0, 0] < 0:
            raise InvalidInput("this answer cannot be written")
        return answer.outputs["label"].tolist()

    async def main() -> tuple[str, list[Any]]:
        rows = [DIGITS[i : i + 1].copy() for i in range(4)]
        rows[2][0, 0] = -1.0  # the model runs it; its answer's encoding fails
        served = [plane.serve(recorder, Arrived("digits-accurate", {"input": x}, encode)) for x in rows]
        return threading.current_thread().name, await asyncio.gather(*served, return_exceptions=True)

    loop_thread, results = asyncio.run(main())
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))
    for i, result in enumerate(results):
        if i == 2:
            assert isinstance(result, InvalidInput) and result.message == "this answer cannot be written"
            continue
        assert not isinstance(result, BaseException), result
        payload, _, timings = result
        assert payload == session.run(["label"], {"input": DIGITS[i : i + 1]})[0].tolist()
        assert timings["encode"] >= 0 and timings["queue"] >= 0 and timings["infer"] >= 0
    assert batcher.batches == 1 and batcher.splits == 0  # one run, not split by the failed encoding
    assert len(threads) == 4 and loop_thread not in threads
    assert all(name.startswith("fnserve-nice") for name in threads), threads
    assert sorted(status for status, _ in recorder.ended) == [200, 200, 200, 422]
    assert all("encode" in timings for status, timings in recorder.ended if status == 200)


def test_batching_settings_are_checked_when_they_load() -> None:
    base = {"name": "m", "path": "m.onnx", "sha256": "a" * 64}
    with pytest.raises(ValidationError, match="only apply with max_batch_time_ms"):
        ModelSettings.validate({**base, "length_buckets": [8]})
    with pytest.raises(ValidationError, match="pad_inputs only apply with max_batch_time_ms"):
        ModelSettings.validate({**base, "pad_inputs": ["ids"]})
    # A token budget bounds every road's runs, batched or not: it counts the lengths of pad_inputs.
    ModelSettings.validate({**base, "pad_inputs": ["ids"], "max_batch_attention": 4096})
    with pytest.raises(
        ValidationError, match="max_queue_delay_ms and max_queue_size only apply with max_batch_time_ms"
    ):
        ModelSettings.validate({**base, "max_queue_size": 8, "max_queue_delay_ms": 100})
    with pytest.raises(ValidationError, match="max_queue_size"):
        ModelSettings.validate({**base, "max_batch_time_ms": 5, "max_queue_size": 0})
    with pytest.raises(ValidationError, match="pad_inputs needs length_buckets"):
        ModelSettings.validate({**base, "max_batch_time_ms": 5, "pad_inputs": ["ids"]})
    with pytest.raises(ValidationError, match="positive and ascending"):
        ModelSettings.validate({**base, "max_batch_time_ms": 5, "length_buckets": [16, 8]})
    ok = ModelSettings.validate({**base, "max_batch_time_ms": 5, "length_buckets": [8, 16], "pad_inputs": ["ids"]})
    assert ok.length_buckets == [8, 16]


def test_a_batched_model_with_a_cache_ttl_serves_a_repeat_request_from_the_cache(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path, cache_ttl=600)
    manifest.write_text(
        manifest.read_text().replace('name = "digits-accurate"\n', 'name = "digits-accurate"\nmax_batch_time_ms = 5\n')
    )
    plane = DataPlane(InferenceService.from_manifest(manifest, eager=True, cache=ResultCache()), batching=True)
    app = create_app(plane, Settings(manifest=manifest, access_log=False))
    batcher = plane.batchers["digits-accurate"]
    x = DIGITS[3:5]
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    labelled = {**body, "outputs": [{"name": "label"}]}

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
            path = "/v2/models/digits-accurate/infer"
            return [await client.post(path, json=doc) for doc in (body, body, labelled, labelled)]

    first, repeat, other, other_repeat = asyncio.run(main())
    assert [r.headers["x-fnserve-cache"] for r in (first, repeat, other, other_repeat)] == [
        "miss",
        "hit",
        "miss",
        "hit",
    ]
    assert repeat.json()["parameters"] == {"cache": "hit"}
    assert repeat.json()["outputs"] == first.json()["outputs"]
    assert [o["name"] for o in other_repeat.json()["outputs"]] == ["label"]
    assert batcher.batches == 2  # the hits never reached the batcher
    assert "queue;dur=" in first.headers["server-timing"] and "queue" not in repeat.headers["server-timing"]
    # /metrics counts the lookups by model: a cache's hit ratio per model, not one for the whole server.
    metrics = ServerMetrics()
    metrics.watch(plane, None)
    lookups = {
        (s.labels["model"], s.labels["tier"], s.labels["result"]): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "fnserve_cache_lookups_total"
    }
    assert lookups == {
        ("digits-accurate", "local", "hit"): 2,
        ("digits-accurate", "remote", "hit"): 0,
        ("digits-accurate", "all", "miss"): 2,
    }


PATIENT = "max_queue_delay_ms = 600000\n"  # requests queued behind the heavy batch wait it out


def minilm_entry(extra: str = "") -> str:
    """The demo's MiniLM in a manifest of a test's own: batched, with a long bucket for one heavy request."""
    import tomllib

    minilm = next(m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"] if m["name"] == "minilm-l6")
    return f'''[[models]]
name = "minilm-l6"
path = "{DEMO_MANIFEST.parent / minilm["path"]}"
sha256 = "{minilm["sha256"]}"
max_batch_size = 64
max_batch_time_ms = 2
length_buckets = [16, 256]
pad_inputs = ["input_ids", "attention_mask", "token_type_ids"]
{extra}'''


def tokens(rows: int, length: int, timeout_us: int | None = None) -> dict[str, object]:
    """A V2 request of MiniLM's three INT64 inputs; ``timeout_us``: Triton's request parameter."""
    ids = np.full((rows, length), 1000, np.int64)
    names = ("input_ids", "attention_mask", "token_type_ids")
    body: dict[str, object] = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
            for n, a in zip(names, (ids, np.ones_like(ids), np.zeros_like(ids)), strict=True)
        ]
    }
    if timeout_us is not None:
        body["parameters"] = {"timeout": timeout_us}
    return body


async def heavy_batch_running(client: httpx.AsyncClient, batcher: AdaptiveBatcher) -> asyncio.Task[httpx.Response]:
    """One heavy MiniLM request (64 rows of 256 tokens: seconds of CPU), once its batch runs: what is sent next
    queues behind it."""
    # The answer's 6.3 million floats as Triton's binary tensors: as JSON, writing and reading them outlast the run.
    body = tokens(64, 256) | {"parameters": {"binary_data_output": True}}
    heavy = asyncio.create_task(client.post("/v2/models/minilm-l6/infer", json=body))
    while batcher.batches < 1:
        await asyncio.sleep(0.001)
    return heavy


def test_a_flood_on_one_model_is_refused_at_once_while_another_keeps_answering(tmp_path: Path) -> None:
    """MiniLM busy with one heavy request (64 rows of 256 tokens: seconds of CPU): of the small requests sent behind
    it, two rows' worth queue (max_queue_size = 2) and the rest are refused at once, 503 with Retry-After; the
    queued ones are refused in turn at their deadline (max_queue_delay_ms), never run; digits answers throughout."""
    import tomllib

    digits = next(m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"] if m["name"] == "digits-accurate")
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(
        minilm_entry("max_queue_size = 2\nmax_queue_delay_ms = 300\n")
        + f'''
[[models]]
name = "digits-accurate"
path = "{DEMO_MANIFEST.parent / digits["path"]}"
sha256 = "{digits["sha256"]}"
max_batch_time_ms = 2
'''
    )
    metrics = ServerMetrics()  # built first, as the server's are: its batchers tell it from the start
    service = InferenceService.from_manifest(manifest, eager=True)
    plane = DataPlane(service, batching=True, observers=metrics.batch_observers)
    app = create_app(plane, Settings(manifest=manifest, access_log=False))
    minilm_batcher = plane.batchers["minilm-l6"]
    metrics.watch(plane, None)

    digit = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}

    async def main() -> tuple[httpx.Response, list[httpx.Response], list[httpx.Response], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=120) as client:
            url = "/v2/models/minilm-l6/infer"
            heavy = await heavy_batch_running(client, minilm_batcher)
            small = [asyncio.create_task(client.post(url, json=tokens(1, 16))) for _ in range(5)]
            answered_meanwhile = 0
            while not all(task.done() for task in small):
                response = await client.post("/v2/models/digits-accurate/infer", json=digit)
                assert response.status_code == 200, response.text
                answered_meanwhile += 1
            return await heavy, [t.result() for t in small], [], answered_meanwhile

    heavy, small, _, digits_answered = asyncio.run(main())
    assert heavy.status_code == 200, heavy.text
    assert [r.status_code for r in small] == [503] * 5
    for response in small:
        assert response.headers["retry-after"] == "1" and "is overloaded" in response.json()["error"]
    reasons = sorted("max_queue_delay_ms" in r.json()["error"] for r in small)
    assert reasons == [False, False, False, True, True], [r.json() for r in small]  # 3 at once, 2 at their deadline
    assert minilm_batcher.batches == 1 and minilm_batcher.admission.shed == 5  # the refused ones never ran
    assert digits_answered > 0  # the other model answered while this one was flooded
    shed = {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "fnserve_requests_shed_total" and s.labels["model"] == "minilm-l6"
    }
    assert shed == {"queue_full": 3, "queue_deadline": 2}  # /metrics counts each refusal, by its reason


def test_a_request_timeout_drops_it_from_the_queue_before_it_runs(tmp_path: Path) -> None:
    """Triton's ``timeout`` request parameter (µs): requests queued behind a heavy batch past their timeout are
    answered 504 and never run, counted as failures in the statistics; one without it waits and is answered."""
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(minilm_entry(PATIENT))
    plane = DataPlane(InferenceService.from_manifest(manifest, eager=True), batching=True)
    app = create_app(plane, Settings(manifest=manifest, access_log=False))
    batcher = plane.batchers["minilm-l6"]

    async def main() -> tuple[httpx.Response, list[httpx.Response], httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=120) as client:
            url = "/v2/models/minilm-l6/infer"
            heavy = await heavy_batch_running(client, batcher)
            timed = [asyncio.create_task(client.post(url, json=tokens(1, 16, timeout_us=20_000))) for _ in range(3)]
            patient = asyncio.create_task(client.post(url, json=tokens(1, 16)))
            bad = await client.post(url, json=tokens(1, 16, timeout_us=-5))
            return await heavy, [await t for t in timed], await patient, bad

    heavy, timed, patient, bad = asyncio.run(main())
    assert heavy.status_code == 200 and patient.status_code == 200
    assert [r.status_code for r in timed] == [504] * 3, [r.text for r in timed]
    assert all("deadline passed before the inference finished" in r.json()["error"] for r in timed)
    assert batcher.batches == 2  # the heavy one, then the patient one alone: the timed-out ones never ran
    assert bad.status_code == 422 and "parameter 'timeout' is microseconds" in bad.json()["error"]
    [stat] = plane.catalog.model_statistics("minilm-l6")
    assert stat["inference_stats"]["fail"]["count"] == 4 and stat["inference_stats"]["success"]["count"] == 2
    assert stat["execution_count"] == 2


def test_an_overloaded_model_refuses_a_request_from_its_headers_before_reading_its_body(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    """MiniLM's queue full (max_queue_size = 2, behind a heavy batch): a request is refused from its path alone,
    503 with Retry-After, though its body never comes (a refusal reads nothing: it must cost next to nothing),
    sent at once, with its request id, and counted as a failure in the statistics and in the access log; the
    queued ones are answered."""
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(minilm_entry("max_queue_size = 2\n" + PATIENT))
    plane = DataPlane(InferenceService.from_manifest(manifest, eager=True), batching=True)
    app = create_app(plane, Settings(manifest=manifest, access_log=True))
    batcher = plane.batchers["minilm-l6"]
    url = "/v2/models/minilm-l6/infer"
    headers = [(b"content-type", b"application/json"), (b"content-length", b"100000"), (b"x-request-id", b"shed-1")]
    scope = post_scope(url, headers)
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    sent_now: list[int] = []  # the messages sent when the app asked its server to send them at once
    scope[SEND_NOW] = lambda: sent_now.append(len(sent))

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=120) as client:
            heavy = await heavy_batch_running(client, batcher)
            queued = [asyncio.create_task(client.post(url, json=tokens(1, 16))) for _ in range(2)]
            while batcher.queued() < 2:
                await asyncio.sleep(0.001)
            await asyncio.wait_for(app(scope, body_never_comes, send), 30)
            return [r.status_code for r in await asyncio.gather(heavy, *queued)]

    assert asyncio.run(main()) == [200, 200, 200]
    start, body = sent
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]  # type: ignore[operator]
    assert (b"x-request-id", b"shed-1") in start["headers"]  # type: ignore[operator]
    assert sent_now == [2]  # the refusal, whole, leaves at once (fnserve's protocol: not at the turn's end)
    error = json.loads(body["body"])["error"]  # type: ignore[arg-type]
    assert "model 'minilm-l6' is overloaded: 2 rows wait already, 2 at most (max_queue_size)" in error
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines() if line.startswith("{")]
    [refused] = [line for line in lines if line["message"] == "inference refused"]
    assert refused["request_id"] == "shed-1" and refused["status"] == 503 and refused["error"] == error
    # The heavy batch, then the two queued: nothing of its ran.
    assert batcher.admission.shed == 1 and batcher.batches == 2
    [stat] = plane.catalog.model_statistics("minilm-l6")
    assert stat["inference_stats"]["fail"]["count"] == 1 and stat["inference_stats"]["success"]["count"] == 3


def test_a_lower_priority_model_runs_its_batches_on_threads_the_os_favours_less(tmp_path: Path) -> None:
    """Two batched models in one process: the higher priority's batches run at nice 5 over the process (below its
    event loop), the other's 5 higher still."""
    import tomllib

    demo = {m["name"]: m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"]}
    entries = ""
    for name, priority in (("digits-fast", 1), ("digits-accurate", 0)):
        entries += f'''[[models]]
name = "{name}"
path = "{DEMO_MANIFEST.parent / demo[name]["path"]}"
sha256 = "{demo[name]["sha256"]}"
max_batch_time_ms = 2
priority = {priority}
'''
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(entries)
    service = InferenceService.from_manifest(manifest, eager=True)
    seen: dict[str, int] = {}
    ran = service.run

    def recorded(model: str, feed: object, **options: object) -> object:
        seen[model] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return ran(model, feed, **options)  # type: ignore[arg-type]

    service.run = recorded  # type: ignore[method-assign]
    plane = DataPlane(service, batching=True)

    async def main() -> None:
        for name in ("digits-fast", "digits-accurate"):
            await plane.batchers[name].predict({"input": DIGITS[:1]})

    asyncio.run(main())
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen == {"digits-fast": base + 5, "digits-accurate": base + 10}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the loop's thread: untouched


def test_a_full_queue_refuses_over_grpc_with_unavailable_and_over_sagemaker_with_503(tmp_path: Path) -> None:
    """The same bound, whatever carries the request: behind a heavy batch and a full queue, gRPC's ModelInfer is
    UNAVAILABLE (the server is fine and the call may be tried again, not RESOURCE_EXHAUSTED: no quota of the
    caller's ran out) and SageMaker's /invocations 503 with Retry-After, both with the bound that refused them,
    the 503 sent at once."""
    import grpc

    from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
    from fnserve.adapters.grpc.proto import open_inference_grpc_pb2_grpc as pb_grpc
    from fnserve.adapters.grpc.server import GrpcServer

    manifest = tmp_path / "manifest.toml"
    manifest.write_text(minilm_entry("max_queue_size = 2\n" + PATIENT))
    plane = DataPlane(InferenceService.from_manifest(manifest, eager=True), batching=True)
    app = create_app(plane, Settings(manifest=manifest, access_log=False))
    batcher = plane.batchers["minilm-l6"]
    ids = np.full((1, 16), 1000, np.int64)
    request = pb.ModelInferRequest(model_name="minilm-l6")
    for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("token_type_ids", 0 * ids)):
        request.inputs.add(name=name, datatype="INT64", shape=[1, 16])
        request.raw_input_contents.append(array.tobytes())

    sent_now: list[str] = []  # the paths whose answers the app asked its server to send at once

    async def served(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[SEND_NOW] = lambda: sent_now.append(scope["path"])
        await app(scope, receive, send)

    async def main() -> tuple[grpc.aio.AioRpcError, httpx.Response, list[int]]:
        server = GrpcServer(plane, "127.0.0.1", 0, max_message_bytes=2**20, grace_seconds=1)
        await server.start()
        transport = httpx.ASGITransport(app=served)
        try:
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=120) as client,
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
            ):
                heavy = await heavy_batch_running(client, batcher)
                url = "/v2/models/minilm-l6/infer"
                queued = [asyncio.create_task(client.post(url, json=tokens(1, 16))) for _ in range(2)]
                while batcher.queued() < 2:
                    await asyncio.sleep(0.001)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
                target = {"x-amzn-sagemaker-target-model": "minilm-l6"}
                sagemaker = await client.post("/invocations", json=tokens(1, 16), headers=target)
                answered = [r.status_code for r in await asyncio.gather(heavy, *queued)]
        finally:
            await server.stop()
        return refused.value, sagemaker, answered

    refused, sagemaker, answered = asyncio.run(main())
    assert answered == [200, 200, 200]
    assert sent_now == ["/invocations"]  # the refusal leaves at once; the answers at the end of their turn
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
    assert "model 'minilm-l6' is overloaded: 2 rows wait already, 2 at most (max_queue_size)" in str(refused.details())
    assert sagemaker.status_code == 503 and sagemaker.headers["retry-after"] == "1"
    assert "is overloaded" in sagemaker.json()["error"]
    assert batcher.admission.shed == 2 and batcher.batches == 2  # neither refused request ran
