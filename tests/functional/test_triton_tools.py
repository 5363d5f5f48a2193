"""Triton's own tools against ``fnserve serve``: the statistics and model-configuration extensions over HTTP and
gRPC through tritonclient unchanged, Triton's wording for an unknown model, and Triton's shape for text."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.helpers.serving import Served, stop
from tests.servers import free_port, start_server

X = np.load(DEMO_HOLDOUT)["input"]
T = TypeVar("T")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The demo manifest on two front processes running the models themselves, HTTP and gRPC: each front
    process counts its own requests, and either one answers for both."""
    port = free_port()
    log = tmp_path_factory.mktemp("triton-tools") / "serve.log"
    options = ["-m", str(DEMO_MANIFEST), "--grpc-port", str(port), "--processes", "2", "--workers", "0"]
    proc, url = start_server(options, log, new_session=True)
    served = Served(proc, f"127.0.0.1:{port}", log, url)
    yield served
    stop(served)


@pytest.fixture(scope="module")
def http(served: Served) -> Iterator[triton_http.InferenceServerClient]:
    client = triton_http.InferenceServerClient(served.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(served: Served) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(served.address)
    yield client
    client.close()


def until(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 10.0) -> T:
    """``read()`` until ``done`` says so: the other front process shares its figures every 0.1 s."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


def digits_input(rows: int, module: Any = triton_http) -> Any:
    inp = module.InferInput("input", [rows, 64], "FP32")
    inp.set_data_from_numpy(X[:rows])
    return inp


def counts(stat: dict[str, Any]) -> dict[str, int]:
    inference = stat["inference_stats"]
    return {stage: int(inference.get(stage, {}).get("count", 0)) for stage in ("success", "fail", "queue")}


def test_statistics_count_what_was_sent_over_both_transports_and_both_processes(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient, served: Served
) -> None:
    before = http.get_inference_statistics("digits-accurate")["model_stats"][0]
    started_ms = time.time() * 1000
    for _ in range(3):
        http.infer("digits-accurate", [digits_input(2)])
    for _ in range(2):
        grpc.infer("digits-accurate", [digits_input(1, triton_grpc)])
    bad = triton_http.InferInput("input", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="must have 64 at axis 1"):
        http.infer("digits-accurate", [bad])
    # New connections land on either front process (SO_REUSEPORT): a few more spread the requests over both.
    for _ in range(6):
        with httpx.Client(base_url=served.url) as fresh:
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": X[0].tolist()}]}
            assert fresh.post("/v2/models/digits-accurate/infer", json=body).status_code == 200

    def stat() -> dict[str, Any]:
        return dict(http.get_inference_statistics("digits-accurate")["model_stats"][0])

    after = until(stat, lambda s: counts(s)["success"] - counts(before)["success"] == 11)
    assert (after["name"], after["version"]) == ("digits-accurate", "1")
    assert counts(after)["success"] - counts(before)["success"] == 11
    assert counts(after)["fail"] - counts(before)["fail"] == 1
    assert counts(after)["queue"] - counts(before)["queue"] == 11  # unbatched: a zero wait each
    # Unbatched: every request one execution of its own rows.
    assert after["inference_count"] - before["inference_count"] == 3 * 2 + 2 + 6
    assert after["execution_count"] - before["execution_count"] == 11
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    was = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in before["batch_stats"]}
    assert sizes[2] - was.get(2, 0) == 3 and sizes[1] - was.get(1, 0) == 8
    for stage in ("success", "compute_input", "compute_infer", "compute_output"):
        assert int(after["inference_stats"][stage]["ns"]) > int(before["inference_stats"][stage]["ns"]), stage
    assert int(after["last_inference"]) >= started_ms - 1000
    # gRPC reads the same figures (from whichever process its connection landed on: once the other's are shared).
    over_grpc = until(
        lambda: grpc.get_inference_statistics("digits-accurate", "1").model_stats[0],
        lambda s: s.inference_stats.success.count >= counts(after)["success"],
    )
    assert over_grpc.inference_stats.success.count >= counts(after)["success"]
    assert over_grpc.inference_count >= after["inference_count"]


def test_batched_runs_count_once_per_batch(http: triton_http.InferenceServerClient, served: Served) -> None:
    def model() -> dict[str, Any]:
        return dict(http.get_inference_statistics("minilm-l6")["model_stats"][0])

    def pipeline() -> dict[str, Any]:
        return dict(http.get_inference_statistics("minilm-embed")["model_stats"][0])

    model_before, pipeline_before = model(), pipeline()
    texts = [f"sentence number {i} about serving models" for i in range(32)]

    def embed(text: str) -> int:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
        return httpx.post(f"{served.url}/v2/models/minilm-embed/infer", json=body, timeout=30).status_code

    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(embed, texts)) == {200}
    after = until(model, lambda s: s["inference_count"] - model_before["inference_count"] == 32)
    rows = after["inference_count"] - model_before["inference_count"]
    runs = after["execution_count"] - model_before["execution_count"]
    assert rows == 32 and 1 <= runs <= 32
    batched = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    was = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in model_before["batch_stats"]}
    assert sum(size * (n - was.get(size, 0)) for size, n in batched.items()) == 32
    served_by_pipeline = until(pipeline, lambda s: counts(s)["success"] - counts(pipeline_before)["success"] == 32)
    assert counts(served_by_pipeline)["success"] - counts(pipeline_before)["success"] == 32
    # The pipeline's own figures are its requests' (as Triton counts an ensemble's), with its model's version.
    assert served_by_pipeline["version"] == "1"
    assert served_by_pipeline["execution_count"] - pipeline_before["execution_count"] == 32


def test_statistics_of_everything_and_unknown_names(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    names = {s["name"] for s in http.get_inference_statistics()["model_stats"]}
    assert {"digits-accurate", "digits-fast", "minilm-l6", "minilm-embed", "digits", "digits-image"} <= names
    assert {s.name for s in grpc.get_inference_statistics().model_stats} == names
    for call in (lambda: http.get_inference_statistics("nope"), lambda: grpc.get_inference_statistics("nope")):
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
            call()
    with pytest.raises(InferenceServerException, match="'digits-fast' version 9 is not found"):
        http.get_inference_statistics("digits-fast", "9")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        grpc.infer("nope", [digits_input(1, triton_grpc)])


def test_model_configuration_over_http_and_grpc(
    http: triton_http.InferenceServerClient, grpc: triton_grpc.InferenceServerClient
) -> None:
    digits = http.get_model_config("digits-accurate")
    assert (digits["platform"], digits["backend"], digits["max_batch_size"]) == (
        "onnxruntime_onnx",
        "onnxruntime",
        1024,
    )
    assert [(t["name"], t["data_type"], t["dims"]) for t in digits["input"]] == [("input", "TYPE_FP32", [64])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in digits["output"]] == [
        ("label", "TYPE_INT64", []),
        ("probabilities", "TYPE_FP32", [10]),
    ]
    assert digits["instance_group"] == [{"name": "cpu", "kind": "KIND_CPU", "count": 2}]  # one per front process
    assert "dynamic_batching" not in digits
    over_grpc = grpc.get_model_config("digits-accurate", "1").config
    assert (over_grpc.name, over_grpc.platform, over_grpc.max_batch_size) == (
        "digits-accurate",
        "onnxruntime_onnx",
        1024,
    )
    assert [(t.name, list(t.dims)) for t in over_grpc.input] == [("input", [64])]
    assert over_grpc.instance_group[0].kind == over_grpc.instance_group[0].KIND_CPU
    assert over_grpc.instance_group[0].count == 2

    minilm = grpc.get_model_config("minilm-l6").config
    assert minilm.dynamic_batching.max_queue_delay_microseconds == 2000  # max_batch_time_ms = 2
    policy = minilm.dynamic_batching.default_queue_policy
    assert policy.max_queue_size == 0  # no bound on the count: the wait bounds the queue
    assert policy.default_timeout_microseconds == 1_000_000 and policy.allow_timeout_override
    assert [(t.name, list(t.dims)) for t in minilm.input][0] == ("input_ids", [-1])

    text = http.get_model_config("minilm-embed")
    assert text["platform"] == "fnserve_pipeline" and text["max_batch_size"] == 64
    wanted = {"name": "text", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}
    assert {k: text["input"][0][k] for k in wanted} == wanted
    assert http.get_model_config("digits")["platform"] == "fnserve_cascade"
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        grpc.get_model_config("nope")


def test_text_shaped_as_triton_shapes_it(http: triton_http.InferenceServerClient) -> None:
    """Triton's tools send one-value-a-row inputs as [n, 1], from the metadata's [-1, 1]."""
    meta = http.get_model_metadata("minilm-embed")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
    texts = np.array([b"the cat sat on the mat", b"a dog"], dtype=object)
    answers = []
    for shape in ([2], [2, 1]):
        inp = triton_http.InferInput("text", shape, "BYTES")
        inp.set_data_from_numpy(texts.reshape(shape))
        answers.append(http.infer("minilm-embed", [inp]).as_numpy("embedding"))
    assert answers[0].shape == answers[1].shape == (2, 384)
    np.testing.assert_array_equal(answers[0], answers[1])


def test_config_and_statistics_are_documented(served: Served) -> None:
    paths = httpx.get(f"{served.url}/openapi.json").json()["paths"]
    for path in ("/v2/models/stats", "/v2/models/{name}/stats", "/v2/models/{name}/versions/{version}/config"):
        assert "get" in paths[path], path


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compression_keeps_working(grpc: triton_grpc.InferenceServerClient, algorithm: str) -> None:
    plain = grpc.infer("digits-accurate", [digits_input(4, triton_grpc)])
    compressed = grpc.infer("digits-accurate", [digits_input(4, triton_grpc)], compression_algorithm=algorithm)
    np.testing.assert_array_equal(plain.as_numpy("probabilities"), compressed.as_numpy("probabilities"))
    np.testing.assert_array_equal(plain.as_numpy("label"), compressed.as_numpy("label"))
