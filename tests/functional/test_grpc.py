"""The Open Inference Protocol over gRPC on a real ``fnserve serve --grpc-port``, with tritonclient.grpc unchanged.

Malformed requests go through tritonclient's own generated stub (``service_pb2``), which sends
whatever message it is given, where tritonclient's ``InferInput`` would refuse most of them itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import service_pb2 as tpb
from tritonclient.grpc import service_pb2_grpc as tpb_grpc
from tritonclient.utils import InferenceServerException

import fnserve
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, sample_arrays, write_test_manifest
from tests.helpers.serving import MAX_REQUEST_BYTES, Served, serve_with_grpc, stop
from tests.moto import free_port
from tests.servers import wait_for

HOLDOUT = np.load(DEMO_HOLDOUT)
DIGITS = HOLDOUT["input"]
SLOW_ROWS = 3000  # seconds of work for the slow model in one worker


@pytest.fixture
def client(grpc_served: Served) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(grpc_served.address)
    yield c
    c.close()


@pytest.fixture
def channel(grpc_served: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(grpc_served.address) as c:
        yield c


@pytest.fixture
def stub(channel: grpc.Channel) -> tpb_grpc.GRPCInferenceServiceStub:
    return tpb_grpc.GRPCInferenceServiceStub(channel)


def raw_onnxruntime(model: str, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
    return session.run(["label", "probabilities"], {"input": x})  # type: ignore[no-any-return]


def digits_input(x: np.ndarray) -> triton.InferInput:
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def status(exc: InferenceServerException) -> str:
    return str(exc.status())


# -- service, health and reflection ---------------------------------------------------------------


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    server = client.get_server_metadata()
    assert (server.name, server.version) == ("fnserve", fnserve.__version__)
    assert "binary_tensor_data" in server.extensions
    assert client.is_model_ready("digits-accurate") and client.is_model_ready("digits-accurate", "1")
    meta = client.get_model_metadata("digits-accurate", "1")
    assert (meta.name, list(meta.versions), meta.platform) == ("digits-accurate", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("input", "FP32", [-1, 64])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("label", "INT64", [-1]),
        ("probabilities", "FP32", [-1, 10]),
    ]
    assert client.get_model_metadata("digits").platform == "fnserve_cascade"
    assert client.is_model_ready("digits")
    for call in (lambda: client.get_model_metadata("nope"), lambda: client.is_model_ready("digits-accurate", "9")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert status(info.value) == "StatusCode.NOT_FOUND", info.value


def test_the_standard_health_service_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "inference.GRPCInferenceService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == serving

    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.health.v1.Health"),
    ]
    listed, inference, health_file = reflection.ServerReflectionInfo(iter(requests), timeout=10)
    names = {s.name for s in listed.list_services_response.service}
    services = {"inference.GRPCInferenceService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
    assert services <= names
    assert inference.file_descriptor_response.file_descriptor_proto, inference
    assert health_file.file_descriptor_response.file_descriptor_proto, health_file


# -- inference ------------------------------------------------------------------------------------


def test_digits_inference_matches_onnxruntime(client: triton.InferenceServerClient) -> None:
    x = DIGITS[:16]
    result = client.infer("digits-accurate", [digits_input(x)], request_id="g-1")
    label, probabilities = raw_onnxruntime("digits-accurate", x)
    np.testing.assert_array_equal(result.as_numpy("label"), label)
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-6)
    assert np.mean(label == HOLDOUT["labels"][:16]) > 0.9
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("g-1", "digits-accurate", "1")

    only = client.infer("digits-accurate", [digits_input(x)], outputs=[triton.InferRequestedOutput("label")])
    assert [o.name for o in only.get_response().outputs] == ["label"]
    np.testing.assert_array_equal(only.as_numpy("label"), label)


def test_every_datatype_round_trips_in_raw_contents(client: triton.InferenceServerClient) -> None:
    arrays = sample_arrays()
    inputs = []
    for datatype, array in arrays.items():
        inp = triton.InferInput(f"in_{datatype}", list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    result = client.infer("identity", inputs)
    for datatype, array in arrays.items():
        got = result.as_numpy(f"out_{datatype}")
        assert got is not None and got.shape == array.shape, datatype
        if datatype == "BYTES":
            assert got.ravel().tolist() == array.ravel().tolist()
        else:
            assert got.dtype == array.dtype, datatype
            np.testing.assert_array_equal(got, array)


def test_typed_contents_in_raw_contents_out_as_triton_answers(stub: tpb_grpc.GRPCInferenceServiceStub) -> None:
    x = DIGITS[:5]
    request = tpb.ModelInferRequest(model_name="digits-accurate", id="typed")
    request.inputs.add(name="input", datatype="FP32", shape=x.shape).contents.fp32_contents.extend(x.ravel())
    response = stub.ModelInfer(request, timeout=10)
    # Triton answers in raw_output_contents whatever the request sent: clients index raw_output_contents[i].
    assert [o.name for o in response.outputs] == ["label", "probabilities"]
    assert not any(o.HasField("contents") for o in response.outputs)
    label, probabilities = raw_onnxruntime("digits-accurate", x)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<i8"), label)
    np.testing.assert_allclose(
        np.frombuffer(response.raw_output_contents[1], "<f4").reshape(5, 10), probabilities, rtol=1e-6
    )
    assert response.id == "typed"


def test_typed_contents_out_when_asked(stub: tpb_grpc.GRPCInferenceServiceStub) -> None:
    x = DIGITS[:5]
    request = tpb.ModelInferRequest(model_name="digits-accurate", id="typed")
    request.inputs.add(name="input", datatype="FP32", shape=x.shape).contents.fp32_contents.extend(x.ravel())
    request.parameters["binary_data_output"].bool_param = False
    response = stub.ModelInfer(request, timeout=10)
    assert not response.raw_output_contents
    label, probabilities = raw_onnxruntime("digits-accurate", x)
    outputs = {o.name: o for o in response.outputs}
    assert list(outputs["label"].contents.int64_contents) == label.tolist()
    assert list(outputs["probabilities"].shape) == [5, 10]
    np.testing.assert_allclose(outputs["probabilities"].contents.fp32_contents, probabilities.ravel(), rtol=1e-6)


def test_the_request_id_and_stage_timings_come_back_as_trailing_metadata(
    stub: tpb_grpc.GRPCInferenceServiceStub,
) -> None:
    request = tpb.ModelInferRequest(model_name="digits-accurate")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(DIGITS[:1].tobytes())
    _, call = stub.ModelInfer.with_call(request, metadata=(("x-request-id", "rid-7"),), timeout=10)
    trailing = dict(call.trailing_metadata())
    assert trailing["x-request-id"] == "rid-7"
    assert {"decode", "infer", "encode"} <= {part.split(";")[0] for part in trailing["server-timing"].split(", ")}


def test_a_cascade_answers_with_its_parameters(client: triton.InferenceServerClient) -> None:
    result = client.infer("digits", [digits_input(DIGITS[:4])])
    parameters = result.get_response().parameters
    assert parameters["answered_by"].string_param == "digits-fast"
    assert parameters["followup_status"].string_param in {"skipped", "pending", "none"}
    label, _ = raw_onnxruntime("digits-fast", DIGITS[:4])
    np.testing.assert_array_equal(result.as_numpy("label"), label)


# -- errors ---------------------------------------------------------------------------------------


def infer_request(model: str = "digits-accurate", **fields: Any) -> tpb.ModelInferRequest:
    return tpb.ModelInferRequest(model_name=model, **fields)


def with_input(
    request: tpb.ModelInferRequest, name: str, datatype: str, shape: list[int], raw: bytes | None = None
) -> tpb.ModelInferRequest:
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return tensor  # type: ignore[no-any-return]


def bad(case: str) -> tpb.ModelInferRequest:
    """A request that is wrong in the way ``case`` says."""
    one = DIGITS[:1].tobytes()
    r = infer_request()
    if case == "unknown model":
        r.model_name = "nope"
        with_input(r, "input", "FP32", [1, 64], one)
    elif case == "unknown version":
        r.model_version = "9"
        with_input(r, "input", "FP32", [1, 64], one)
    elif case == "no inputs":
        pass
    elif case == "unknown datatype":
        with_input(r, "input", "FP8", [1, 64], one)
    elif case == "negative shape":
        with_input(r, "input", "FP32", [-1, 64], one)
    elif case == "wrong shape":
        with_input(r, "input", "FP32", [1, 32], DIGITS[:1, :32].tobytes())
    elif case == "raw size":
        with_input(r, "input", "FP32", [1, 64], one[:100])
    elif case == "raw count":
        with_input(r, "input", "FP32", [1, 64], one)
        r.raw_input_contents.append(one)
    elif case == "contents field":
        with_input(r, "input", "FP32", [1, 2]).contents.int_contents.extend([1, 2])
    elif case == "contents count":
        with_input(r, "input", "FP32", [1, 64]).contents.fp32_contents.extend([1.0, 2.0, 3.0])
    elif case == "fp16 contents":
        r.model_name = "identity"
        with_input(r, "in_FP16", "FP16", [1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    elif case == "out of range":
        r.model_name = "identity"
        with_input(r, "in_INT8", "INT8", [1, 2]).contents.int_contents.extend([300, 1])
    elif case == "truncated bytes":
        r.model_name = "identity"
        with_input(r, "in_BYTES", "BYTES", [1, 2], b"\x05\x00\x00\x00abc")
    elif case == "both contents and raw":
        with_input(r, "input", "FP32", [1, 64], one).contents.fp32_contents.extend(DIGITS[0])
    elif case == "duplicate input":
        with_input(r, "input", "FP32", [1, 64], one)
        with_input(r, "input", "FP32", [1, 64], one)
    elif case == "wrong input name":
        with_input(r, "pixels", "FP32", [1, 64], one)
    elif case == "wrong datatype":
        with_input(r, "input", "INT64", [1, 64], np.zeros((1, 64), np.int64).tobytes())
    elif case == "unknown output":
        with_input(r, "input", "FP32", [1, 64], one)
        r.outputs.add(name="logits")
    elif case == "too large":
        x = np.zeros((MAX_REQUEST_BYTES // 256 + 1, 64), np.float32)
        with_input(r, "input", "FP32", list(x.shape), x.tobytes())
    else:
        raise AssertionError(case)
    return r


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("unknown model", grpc.StatusCode.NOT_FOUND, "'nope'"),
        (
            "unknown version",
            grpc.StatusCode.NOT_FOUND,
            "Request for unknown model: 'digits-accurate' version 9 is not found",
        ),
        ("no inputs", grpc.StatusCode.INVALID_ARGUMENT, "non-empty list"),
        ("unknown datatype", grpc.StatusCode.INVALID_ARGUMENT, "unknown datatype 'FP8'"),
        ("negative shape", grpc.StatusCode.INVALID_ARGUMENT, "non-negative"),
        ("wrong shape", grpc.StatusCode.INVALID_ARGUMENT, "must have 64 at axis 1"),
        ("raw size", grpc.StatusCode.INVALID_ARGUMENT, "needs 256 bytes"),
        ("raw count", grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 2 entries for 1 inputs"),
        ("contents field", grpc.StatusCode.INVALID_ARGUMENT, "goes in contents.fp32_contents, not int_contents"),
        ("contents count", grpc.StatusCode.INVALID_ARGUMENT, "needs 64 elements, contents has 3"),
        ("fp16 contents", grpc.StatusCode.INVALID_ARGUMENT, "FP16 has no typed contents field"),
        ("out of range", grpc.StatusCode.INVALID_ARGUMENT, "out of range for INT8"),
        ("truncated bytes", grpc.StatusCode.INVALID_ARGUMENT, "BYTES element overruns"),
        ("both contents and raw", grpc.StatusCode.INVALID_ARGUMENT, "both 'contents' and raw_input_contents"),
        ("duplicate input", grpc.StatusCode.INVALID_ARGUMENT, "appears twice"),
        ("wrong input name", grpc.StatusCode.INVALID_ARGUMENT, "'pixels'"),
        ("wrong datatype", grpc.StatusCode.INVALID_ARGUMENT, "int64 cannot be cast"),
        ("unknown output", grpc.StatusCode.INVALID_ARGUMENT, "'logits'"),
        ("too large", grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ],
)
def test_each_bad_request_gets_its_status_and_the_server_goes_on(
    stub: tpb_grpc.GRPCInferenceServiceStub, case: str, code: grpc.StatusCode, says: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(bad(case), timeout=10)
    error: Any = info.value
    assert error.code() == code, error.details()
    assert says in error.details(), error.details()
    good = infer_request()
    with_input(good, "input", "FP32", [1, 64], DIGITS[:1].tobytes())
    assert len(stub.ModelInfer(good, timeout=10).raw_output_contents) == 2


# -- deadlines, dead workers, shutdown ------------------------------------------------------------


def slow_input(rows: int = SLOW_ROWS) -> triton.InferInput:
    inp = triton.InferInput("x", [rows, 8], "FP32")
    inp.set_data_from_numpy(np.ones((rows, 8), np.float32))
    return inp


def worker_pid(server_pid: int) -> int:
    """The one inference worker (a spawned child) of a ``--processes 1 --workers 1`` server."""
    # Every thread's children: a replacement worker is started by the pool's dispatcher thread.
    children = [
        c for task in Path(f"/proc/{server_pid}/task").iterdir() for c in (task / "children").read_text().split()
    ]
    workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(workers) == 1, workers
    return workers[0]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def in_background(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def until_idle(client: triton.InferenceServerClient) -> None:
    """Until the one worker has answered everything sent before (a call queues behind them), and started."""
    assert client.infer("digits-accurate", [digits_input(DIGITS[:1])], client_timeout=60).as_numpy("label") is not None


def wait_until_busy(pid: int) -> None:
    """Until ``pid`` has used 0.2 s more CPU: an idle worker doing that is running the slow model."""
    start = cpu_ticks(pid)
    ticks = os.sysconf("SC_CLK_TCK")
    wait_for(lambda: cpu_ticks(pid) - start >= 0.2 * ticks, 30, "the worker to run the slow model")


def test_a_deadline_that_passes_is_deadline_exceeded_and_the_server_goes_on(
    client: triton.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("slow", [slow_input()], client_timeout=0.3)
    assert status(info.value) == "StatusCode.DEADLINE_EXCEEDED"
    result = client.infer("digits-accurate", [digits_input(DIGITS[:2])], client_timeout=60)
    assert result.as_numpy("label").shape == (2,)


def test_a_worker_killed_mid_call_answers_unavailable_and_the_server_goes_on(
    grpc_served: Served, client: triton.InferenceServerClient
) -> None:
    until_idle(client)
    victim = worker_pid(grpc_served.proc.pid)
    thread, outcome = in_background(lambda: client.infer("slow", [slow_input()], client_timeout=60))
    wait_until_busy(victim)
    os.kill(victim, signal.SIGKILL)
    thread.join(60)
    error = outcome.get("error")
    assert isinstance(error, InferenceServerException), outcome
    assert status(error) == "StatusCode.UNAVAILABLE" and "worker died" in str(error.message()), error

    def answers() -> bool:
        result = client.infer("digits-accurate", [digits_input(DIGITS[:2])], client_timeout=60)
        return result.as_numpy("label").shape == (2,)

    assert answers()
    assert worker_pid(grpc_served.proc.pid) != victim


def test_sigterm_lets_a_call_in_flight_finish_then_stops(tmp_path: Path) -> None:
    served = serve_with_grpc(tmp_path)
    try:
        client = triton.InferenceServerClient(served.address)
        until_idle(client)
        thread, outcome = in_background(lambda: client.infer("slow", [slow_input(1000)], client_timeout=60))
        wait_until_busy(worker_pid(served.proc.pid))
        os.killpg(served.proc.pid, signal.SIGTERM)
        thread.join(60)
        assert "result" in outcome, outcome
        assert outcome["result"].as_numpy("y").shape == (1000,)
        assert served.proc.wait(timeout=60) in (0, -signal.SIGTERM)
        with pytest.raises(InferenceServerException) as info:
            client.is_server_live()
        assert status(info.value) == "StatusCode.UNAVAILABLE"
        client.close()
    finally:
        stop(served)
    assert "Traceback" not in served.log.read_text()


def test_a_grpc_port_in_use_stops_the_start_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        manifest = write_test_manifest(tmp_path)
        result = subprocess.run(
            [
                *[sys.executable, "-m", "fnserve", "serve", "-m", str(manifest), "--port", str(free_port())],
                *["--grpc-port", str(port), "--processes", "1", "--workers", "0"],
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0 and "loaded model" not in result.stderr  # before any model loads
    assert f"gRPC port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in result.stdout + result.stderr


def test_bytes_that_are_not_a_request_are_invalid_argument(channel: grpc.Channel) -> None:
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as info:
        infer(b"\x0a\x05ab", timeout=10)  # model_name says 5 bytes follow; 2 do
    error: Any = info.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a ModelInferRequest" in error.details()


def test_every_front_process_serves_grpc_on_the_shared_port(tmp_path: Path) -> None:
    served = serve_with_grpc(tmp_path, ("--processes", "2", "--workers", "0"))
    try:
        listening = f"gRPC listening on {served.address}"
        wait_for(lambda: served.log.read_text().count(listening) == 2, 60, "both front processes to listen")
        x = DIGITS[:3]
        label, _ = raw_onnxruntime("digits-accurate", x)
        for _ in range(20):  # new connections: the kernel spreads them over both processes
            c = triton.InferenceServerClient(served.address)
            np.testing.assert_array_equal(c.infer("digits-accurate", [digits_input(x)]).as_numpy("label"), label)
            c.close()
    finally:
        stop(served)
