"""The gRPC codec (typed and raw contents, parameters) and the committed stubs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2 as triton_pb

from fnserve.adapters.grpc import codec
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.adapters.grpc.service import InferenceServicer
from fnserve.bootstrap import build_dataplane
from fnserve.core.datatypes import V2_TO_NUMPY
from fnserve.core.errors import DeadlineExceeded, InvalidInput, grpc_code
from fnserve.settings import Settings
from tests.helpers import REPO, sample_arrays, write_test_manifest

PROTO = Path("fnserve/adapters/grpc/proto/open_inference_grpc.proto")


def test_the_committed_stubs_describe_the_proto(tmp_path: Path) -> None:
    """Regenerate with ``make grpc-stubs`` when this fails."""
    out = tmp_path / "proto.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--descriptor_set_out={out}", str(PROTO)],
        cwd=REPO / "layers" / "fnserve",
        check=True,
    )
    expected = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    committed = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert committed == without_json_names(expected)


def without_json_names(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """What protoc embeds in a Python module: the descriptor without the json_name it derives."""
    messages = list(file.message_type)
    while messages:
        message = messages.pop()
        for field in message.field:
            field.ClearField("json_name")
        messages += message.nested_type
    return file


def test_fnserve_and_tritonclient_messages_live_in_one_process_and_agree_on_the_wire() -> None:
    # Both define "inference.ModelInferRequest": in protobuf's default pool together, one import would fail.
    ours = pb.ModelInferRequest(model_name="m", id="7")
    ours.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    ours.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    theirs = triton_pb.ModelInferRequest.FromString(ours.SerializeToString())
    tensor = theirs.inputs[0]
    assert (theirs.model_name, theirs.id, tensor.name, list(tensor.shape)) == ("m", "7", "x", [1, 2])
    assert pb.ModelInferRequest.FromString(theirs.SerializeToString()) == ours


def typed_request(arrays: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity")
    for datatype, array in arrays.items():
        tensor = request.inputs.add(name=f"in_{datatype}", datatype=datatype, shape=array.shape)
        getattr(tensor.contents, codec.CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    return request


def test_typed_contents_of_every_datatype_decode_exactly_and_encode_back() -> None:
    arrays = {k: v for k, v in sample_arrays().items() if k != "FP16"}  # FP16 has no typed field
    decoded = codec.decode_request(typed_request(arrays))
    assert decoded.raw_outputs and decoded.outputs is None  # answered raw, as Triton answers, unless asked
    asking = typed_request(arrays)
    asking.parameters["binary_data_output"].bool_param = False
    assert not codec.decode_request(asking).raw_outputs
    for datatype, array in arrays.items():
        got = decoded.inputs[f"in_{datatype}"]
        assert got.dtype == V2_TO_NUMPY[datatype] and got.shape == array.shape, datatype
        assert got.tolist() == array.tolist(), datatype

    response = pb.ModelInferResponse.FromString(codec.encode_response("identity", "1", arrays, "r", {}, raw=False))
    assert not response.raw_output_contents
    for tensor in response.outputs:
        values = list(getattr(tensor.contents, codec.CONTENTS_FIELD[tensor.datatype]))
        assert values == arrays[tensor.name].ravel().tolist(), tensor.name


def test_raw_contents_of_every_datatype_decode_in_place_and_an_fp16_output_makes_every_output_raw() -> None:
    arrays = sample_arrays()
    wire = codec.encode_response("identity", "1", arrays, "r", {"cache": "miss"}, raw=False)  # FP16 among them
    encoded = pb.ModelInferResponse.FromString(wire)  # what any protobuf client reads
    assert (encoded.model_name, encoded.id, encoded.parameters["cache"].string_param) == ("identity", "r", "miss")
    assert len(encoded.raw_output_contents) == len(arrays)
    request = pb.ModelInferRequest(model_name="identity", id="7")
    for tensor, raw in zip(encoded.outputs, encoded.raw_output_contents, strict=True):
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        request.raw_input_contents.append(raw)
    received = request.SerializeToString()
    parsed = codec.parse_request(received)
    assert parsed.error is None and not parsed.message.raw_input_contents and parsed.message.id == "7"
    decoded = codec.decode_request(parsed.message, parsed.raw)
    assert decoded.raw_outputs  # raw in, raw out
    for datatype, array in arrays.items():
        got = decoded.inputs[datatype]
        assert got.dtype == array.dtype and got.tolist() == array.tolist(), datatype
    fp32 = decoded.inputs["FP32"]
    assert np.shares_memory(fp32, np.frombuffer(received, np.uint8))  # read where gRPC put it: no copy


@pytest.mark.parametrize("wire", [b"\x3a\xff\xff", b"\x0a\x05ab", b"\x0f", b"\xff" * 11])
def test_bytes_that_are_not_a_request_are_reported_not_raised(wire: bytes) -> None:
    parsed = codec.parse_request(wire)
    assert parsed.error is not None and "not a ModelInferRequest" in parsed.error


@pytest.mark.parametrize("where", ["request", "output"])
def test_typed_inputs_may_ask_for_raw_outputs_as_the_binary_extension_does(where: str) -> None:
    request = typed_request({"FP32": np.zeros((1, 2), np.float32)})
    if where == "request":
        request.parameters["binary_data_output"].bool_param = True
    else:
        request.outputs.add(name="out_FP32").parameters["binary_data"].bool_param = True
    assert codec.decode_request(request).raw_outputs


def test_response_parameters_keep_their_types() -> None:
    parameters = {"cache": "hit", "followup_status": "pending", "flag": True, "count": 3, "score": 0.5}
    response = pb.ModelInferResponse.FromString(codec.encode_response("m", "1", {}, "", parameters, raw=True))
    got = {}
    for key, value in response.parameters.items():
        which = value.WhichOneof("parameter_choice")
        got[key] = (which, getattr(value, which))
    assert got == {
        "cache": ("string_param", "hit"),
        "followup_status": ("string_param", "pending"),
        "flag": ("bool_param", True),
        "count": ("int64_param", 3),
        "score": ("double_param", 0.5),
    }


def test_an_int8_sent_as_32_bit_contents_must_fit_in_8_bits() -> None:
    with pytest.raises(InvalidInput, match="out of range for INT8"):
        codec.decode_request(typed_request({"INT8": np.array([[127, 128]], np.int32)}))


def test_a_deadline_already_passed_runs_nothing(tmp_path: Path) -> None:
    plane = build_dataplane(Settings(manifest=str(write_test_manifest(tmp_path)), eager_load=True))
    servicer = InferenceServicer(plane, access_log=False)
    request = pb.ModelInferRequest(model_name="digits-accurate")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    model = plane.service.registry.get("digits-accurate")
    calls = []
    real_run = model.session.run
    model.session.run = lambda *a, **k: calls.append(1) or real_run(*a, **k)  # type: ignore[method-assign]

    parsed = codec.parse_request(request.SerializeToString())

    def serve(deadline: float) -> Any:
        async def arrived() -> codec.ParsedRequest:
            return parsed

        def encode(answer: Any, decoded: codec.GrpcRequest) -> bytes:
            return codec.encode_response(answer.name, answer.version, answer.outputs, "", {}, decoded.raw_outputs)

        decode = lambda p: codec.decode_request(p.message, p.raw)  # noqa: E731
        return asyncio.run(
            servicer.plane.serve(servicer.watcher, "digits-accurate", None, arrived(), decode, encode, None, deadline)
        )

    with pytest.raises(DeadlineExceeded) as raised:
        serve(0.0)
    assert calls == [] and raised.value.status_code == 504 and grpc_code(504) == "DEADLINE_EXCEEDED"
    response, answer, timings = serve(30.0)
    assert calls == [1] and answer.version == "1" and "infer" in timings
    assert len(pb.ModelInferResponse.FromString(response).raw_output_contents) == 2


def test_the_timeout_parameter_is_the_requests_deadline() -> None:
    request = typed_request({"FP32": np.ones((1, 2), np.float32)})
    assert codec.decode_request(request).timeout is None
    request.parameters["timeout"].int64_param = 250_000  # µs, as Triton's clients send it
    assert codec.decode_request(request).timeout == 0.25
    request.parameters["timeout"].int64_param = -1
    with pytest.raises(InvalidInput, match="parameter 'timeout' is microseconds"):
        codec.decode_request(request)
    request.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidInput, match="got 'soon'"):
        codec.decode_request(request)
