"""Open Inference Protocol gRPC messages <-> numpy: raw contents, typed contents, parameters.

``raw_input_contents`` is the fast path, as Triton and ``tritonclient.grpc`` use it: each
entry is the binary tensor extension's bytes of one input (little-endian, C order, BYTES
elements length-prefixed). They are not parsed by protobuf, which would copy each into its
arena and again into a Python ``bytes`` on access: :func:`parse_request` walks the message's
top-level fields and keeps them as views of the bytes gRPC received, which ``np.frombuffer``
reads in place; protobuf parses the rest. Likewise :func:`encode_response` frames
``raw_output_contents`` itself, after the rest of the response that protobuf serialises: the
tensors' bytes are copied once, into the message. Typed ``contents`` go through the same value checks
as JSON data (ranges, integers, booleans). A response carries raw contents, as Triton's always
do (clients written against Triton read ``raw_output_contents[i]``); typed contents only when the
request says ``binary_data_output`` false and every output has a typed field (FP16 has none).
Errors are the data plane's own (:class:`~fnserve.core.errors.InvalidInput`), which the servicer
maps to gRPC status codes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.core.codec.tensors import array_from_json, binary_tensor, from_binary, request_timeout
from fnserve.core.errors import InvalidInput
from fnserve.core.models.datatypes import V2_TO_NUMPY, Arrays, v2_datatype

RAW_INPUT_CONTENTS = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
RAW_OUTPUT_CONTENTS = pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number

# The InferTensorContents field of each datatype; FP16 has none (raw contents only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass(slots=True)
class ParsedRequest:
    """A ModelInferRequest as received: ``message`` without its raw contents, ``raw`` their views in order,
    ``error`` what is wrong with bytes that are not a ModelInferRequest at all (then the rest is empty)."""

    message: pb.ModelInferRequest
    raw: list[memoryview]
    error: str | None = None


def parse_request(data: bytes) -> ParsedRequest:
    """gRPC's request deserializer for ModelInfer: never raises (gRPC would answer a deserializer's
    exception with INTERNAL), a malformed message is reported in ``error``."""
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    try:
        pos, end = 0, len(data)
        while pos < end:
            start = pos
            key, pos = _varint(data, pos)
            field, wire = key >> 3, key & 7
            if wire == 2:
                length, pos = _varint(data, pos)
                if field == RAW_INPUT_CONTENTS:
                    raw.append(view[pos : pos + length])
                pos += length
            elif wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise ValueError(f"wire type {wire}")
            if pos > end:
                raise ValueError("a field runs past the end")
            if field != RAW_INPUT_CONTENTS:
                rest.append(view[start:pos])
        message = pb.ModelInferRequest.FromString(b"".join(rest))
    except (ValueError, IndexError, DecodeError) as exc:
        return ParsedRequest(pb.ModelInferRequest(), [], f"the request is not a ModelInferRequest: {exc}")
    return ParsedRequest(message, raw)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _field_header(field: int, length: int) -> bytes:
    """A length-delimited field's key and length."""
    out = bytearray([field << 3 | 2])
    while length >= 0x80:
        out.append(length & 0x7F | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out)


@dataclass(slots=True)
class GrpcRequest:
    """A decoded ModelInferRequest: the inputs, the outputs asked for (None: all), how to answer."""

    inputs: Arrays
    outputs: list[str] | None
    raw_outputs: bool
    timeout: float | None = None  # seconds (Triton's "timeout" parameter, in µs)


def decode_request(request: pb.ModelInferRequest, raw: Sequence[bytes | memoryview] | None = None) -> GrpcRequest:
    """The arrays of a ModelInferRequest, or an :class:`InvalidInput` saying what is wrong; ``raw``: its raw
    contents when :func:`parse_request` took them out (else those of the message)."""
    if not request.inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    if raw is None:
        raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: give one per input, in order"
        )
    arrays: Arrays = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name:
            raise InvalidInput("each input needs a 'name'")
        if name in arrays:
            raise InvalidInput(f"input {name!r} appears twice")
        dtype = V2_TO_NUMPY.get(tensor.datatype)
        if dtype is None:
            raise InvalidInput(
                f"input {name!r}: unknown datatype {tensor.datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}"
            )
        shape = list(tensor.shape)
        if any(d < 0 for d in shape):
            raise InvalidInput(f"input {name!r}: 'shape' must be non-negative integers, got {shape}")
        size = math.prod(shape)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input {name!r} has both 'contents' and raw_input_contents")
            chunk = raw[i]
            if tensor.datatype == "BYTES" and not isinstance(chunk, bytes):
                chunk = bytes(chunk)  # its elements become bytes objects: copied anyway
            array = from_binary(name, tensor.datatype, dtype, chunk, size)  # type: ignore[arg-type]
        else:
            array = _from_contents(name, tensor, dtype, size)
        arrays[name] = array.reshape(shape)
    outputs = [o.name for o in request.outputs]
    timeout = request.parameters.get("timeout")
    seconds = request_timeout(_parameter_value(timeout)) if timeout is not None else None
    return GrpcRequest(arrays, outputs or None, _raw_outputs(request), seconds)


def _parameter_value(parameter: pb.InferParameter) -> Any:
    """The value an InferParameter holds, whichever field holds it."""
    field = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, field) if field else None


def _from_contents(
    name: str, tensor: pb.ModelInferRequest.InferInputTensor, dtype: np.dtype[Any], size: int
) -> np.ndarray[Any, Any]:
    datatype = tensor.datatype
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input {name!r}: {datatype} has no typed contents field; send it in raw_input_contents")
    others = [f.name for f, _ in tensor.contents.ListFields() if f.name != field]
    if others:
        raise InvalidInput(f"input {name!r}: {datatype} data goes in contents.{field}, not {', '.join(others)}")
    values = getattr(tensor.contents, field)
    if len(values) != size:
        shape = list(tensor.shape)
        raise InvalidInput(f"input {name!r}: shape {shape} needs {size} elements, contents has {len(values)}")
    if datatype == "BYTES":
        out = np.empty(size, dtype=object)
        out[:] = list(values)
        return out
    # Through the JSON path's checks: an INT8 sent as int_contents (32-bit) must fit in 8 bits.
    return array_from_json(name, datatype, dtype, list(values))


def _raw_outputs(request: pb.ModelInferRequest) -> bool:
    """Whether to answer in raw output contents: always, as Triton does, unless the request asks for typed
    contents with the binary extension's parameter (``binary_data_output`` false)."""
    wanted = request.parameters.get("binary_data_output")
    return wanted is None or wanted.bool_param


def encode_response(
    name: str,
    version: str,
    outputs: Mapping[str, np.ndarray[Any, Any]],
    request_id: str,
    parameters: Mapping[str, Any],
    raw: bool,
) -> bytes:
    """The serialised ModelInferResponse of an answer; every output raw, or every output typed (never
    mixed: clients index raw_output_contents by output position)."""
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    for key, value in parameters.items():
        set_parameter(response.parameters[key], value)
    datatypes = {out: v2_datatype(array.dtype) for out, array in outputs.items()}
    raw = raw or "FP16" in datatypes.values()
    blobs: list[bytes] = []
    for out, array in outputs.items():
        datatype = datatypes[out]
        tensor = response.outputs.add(name=out, datatype=datatype, shape=array.shape)
        if raw:
            blob = binary_tensor(array, datatype)
            blobs += (_field_header(RAW_OUTPUT_CONTENTS, len(blob)), blob)
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.ravel())
        else:
            getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(array.ravel().tolist())
    # A repeated field's entries may follow the rest of the message: protobuf parsers merge them.
    return b"".join([response.SerializeToString(), *blobs])


def set_parameter(parameter: pb.InferParameter, value: Any) -> None:
    """``value`` in the InferParameter field of its type (bool before int: a bool is an int in Python)."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)
