"""The V2 codec: JSON and binary tensors both ways, and every way a request can be malformed."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
import simdjson

from fnserve.core.codec import tensors
from fnserve.core.codec.rows import slice_rows
from fnserve.core.codec.tensors import (
    InferenceRequest,
    array_from_json,
    decode_request,
    encode_response,
    pack_arrays,
    pack_rows,
    unpack_arrays,
)
from fnserve.core.errors import BadRequest, InvalidInput
from fnserve.core.models.datatypes import V2_TO_NUMPY
from tests.helpers import sample_arrays


def body(*inputs: dict[str, Any], **fields: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **fields})


def tensor(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def binary_body(arrays: dict[str, tuple[str, np.ndarray]], **fields: Any) -> tuple[bytes, int]:
    """A request with every array sent as binary, as tritonclient frames it."""
    inputs, blobs = [], []
    for name, (datatype, array) in arrays.items():
        if datatype == "BYTES":
            blob = b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
        else:
            blob = array.astype(array.dtype.newbyteorder("<")).tobytes()
        inputs.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    head = orjson.dumps({"inputs": inputs, **fields})
    return head + b"".join(blobs), len(head)


def split_binary_response(payload: bytes, head_length: int) -> dict[str, np.ndarray]:
    from fnserve.core.models.datatypes import V2_TO_NUMPY

    doc = orjson.loads(payload[:head_length])
    offset, out = head_length, {}
    for t in doc["outputs"]:
        size = t["parameters"]["binary_data_size"]
        chunk = payload[offset : offset + size]
        offset += size
        if t["datatype"] == "BYTES":
            items, pos = [], 0
            while pos < len(chunk):
                (n,) = struct.unpack_from("<I", chunk, pos)
                items.append(chunk[pos + 4 : pos + 4 + n])
                pos += 4 + n
            out[t["name"]] = np.array(items, dtype=object).reshape(t["shape"])
        else:
            out[t["name"]] = np.frombuffer(chunk, V2_TO_NUMPY[t["datatype"]]).reshape(t["shape"])
    assert offset == len(payload)
    return out


@pytest.mark.parametrize("datatype", list(sample_arrays()))
def test_every_datatype_decodes_from_json(datatype: str) -> None:
    array = sample_arrays()[datatype]
    data = [v.decode() for v in array.ravel()] if datatype == "BYTES" else array.ravel().tolist()
    request = decode_request(body(tensor("x", datatype, list(array.shape), data)))
    np.testing.assert_array_equal(request.inputs["x"], array)
    assert request.inputs["x"].dtype == array.dtype


@pytest.mark.parametrize("datatype", list(sample_arrays()))
def test_every_datatype_decodes_from_binary(datatype: str) -> None:
    array = sample_arrays()[datatype]
    payload, head = binary_body({"x": (datatype, array)})
    request = decode_request(payload, head)
    np.testing.assert_array_equal(request.inputs["x"], array)
    assert request.inputs["x"].dtype == array.dtype


@pytest.mark.parametrize("datatype", list(sample_arrays()))
def test_every_datatype_encodes_to_json_and_binary(datatype: str) -> None:
    array = sample_arrays()[datatype]
    payload, head = encode_response("m", "1", {"y": array}, InferenceRequest(inputs={}))
    assert head is None
    out = orjson.loads(payload)["outputs"][0]
    assert out["datatype"] == datatype and out["shape"] == list(array.shape)
    expected = [v.decode() for v in array.ravel()] if datatype == "BYTES" else array.ravel().tolist()
    if datatype == "FP16":
        expected = array.astype(np.float32).ravel().tolist()
    assert out["data"] == expected
    payload, head = encode_response("m", "1", {"y": array}, InferenceRequest(inputs={}, binary_default=True))
    assert head is not None
    decoded = split_binary_response(payload, head)["y"]
    np.testing.assert_array_equal(decoded, array)


def test_nested_data_is_accepted() -> None:
    request = decode_request(body(tensor("x", "FP32", [2, 2], [[1, 2], [3, 4]])))
    np.testing.assert_array_equal(request.inputs["x"], [[1, 2], [3, 4]])


@pytest.mark.parametrize(("datatype", "data"), [("FP32", [1.5, True, False]), ("INT64", [7, True, False])])
def test_true_and_false_among_numbers_read_as_one_and_zero(datatype: str, data: list[Any]) -> None:
    """As numpy reads them; Triton refuses them (docs/api.md says so, and why fnserve does not look for them)."""
    request = decode_request(body(tensor("x", datatype, [3], data)))
    np.testing.assert_array_equal(request.inputs["x"], [data[0], 1, 0])


def test_id_parameters_and_requested_outputs_are_kept() -> None:
    request = decode_request(
        body(
            tensor("x", "INT32", [1], [1]),
            id="req-1",
            parameters={"binary_data_output": True, "custom": 3},
            outputs=[{"name": "a", "parameters": {"binary_data": False}}, {"name": "b"}],
        )
    )
    assert request.id == "req-1" and request.parameters["custom"] == 3
    assert request.outputs == ["a", "b"]
    assert request.wants_binary("a") is False and request.wants_binary("b") is True
    payload, _ = encode_response("m", "1", {"a": np.zeros(1)}, request, {"cache": "miss"})
    doc = orjson.loads(payload)
    assert doc["id"] == "req-1" and doc["parameters"] == {"cache": "miss"}


def test_mixed_json_and_binary_inputs_and_outputs() -> None:
    array = np.arange(4, dtype=np.float32)
    payload, head = binary_body({"b": ("FP32", array)})
    doc = orjson.loads(payload[:head])
    doc["inputs"].append(tensor("j", "INT64", [2], [5, 6]))
    head_bytes = orjson.dumps(doc)
    request = decode_request(head_bytes + payload[head:], len(head_bytes))
    np.testing.assert_array_equal(request.inputs["b"], array)
    np.testing.assert_array_equal(request.inputs["j"], [5, 6])
    request.binary_outputs = {"bin": True}
    out, head_len = encode_response("m", "1", {"js": np.array([1.5]), "bin": array}, request)
    assert head_len is not None
    doc = orjson.loads(out[:head_len])
    assert doc["outputs"][0]["data"] == [1.5] and "data" not in doc["outputs"][1]
    np.testing.assert_array_equal(np.frombuffer(out[head_len:], np.float32), array)


BAD_REQUESTS: list[tuple[bytes, int | None, type[Exception], str]] = [
    (b"{not json", None, BadRequest, "not valid JSON"),
    (b"[1, 2]", None, BadRequest, "must be a JSON object"),
    (body(), None, InvalidInput, "'inputs' must be a non-empty list"),
    (orjson.dumps({"inputs": "x"}), None, InvalidInput, "'inputs' must be a non-empty list"),
    (body("x"), None, InvalidInput, "each input must be an object"),
    (body({"datatype": "FP32", "shape": [1], "data": [1]}), None, InvalidInput, "needs a 'name'"),
    (body(tensor("x", "FP128", [1], [1])), None, InvalidInput, "unknown datatype 'FP128'"),
    (body(tensor("x", "FP32", [-1], [1])), None, InvalidInput, "'shape' must be a list of non-negative"),
    (body(tensor("x", "FP32", [1.5], [1])), None, InvalidInput, "'shape' must be a list of non-negative"),
    (body(tensor("x", "FP32", [3], [1, 2])), None, InvalidInput, r"shape \[3\] needs 3 elements, data has 2"),
    (body(tensor("x", "FP32", [2, 2], [[1, 2], [3]])), None, InvalidInput, "ragged"),
    (body(tensor("x", "INT32", [1], [1.5])), None, InvalidInput, "INT32 data must be integers, got floats"),
    # Whole, but written as floats: the fault is the type, not the range.
    (body(tensor("x", "INT32", [2], [1.0, 2.0])), None, InvalidInput, "INT32 data must be integers, got floats"),
    (body(tensor("x", "UINT64", [1], [1e19])), None, InvalidInput, "UINT64 data must be integers, got floats"),
    (body(tensor("x", "UINT8", [1], [256])), None, InvalidInput, "out of range for UINT8"),
    (body(tensor("x", "INT8", [1], [-129])), None, InvalidInput, "out of range for INT8"),
    (  # orjson reads integers past 64 bits as floats
        b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1],"data":[1180591620717411303424]}]}',
        None,
        InvalidInput,
        "values out of range for INT64",
    ),
    (
        body(tensor("x", "UINT64", [2], [True, False])),
        None,
        InvalidInput,
        "UINT64 data must be numbers, got true/false",
    ),
    (body(tensor("x", "INT32", [1], [True])), None, InvalidInput, "INT32 data must be numbers, got true/false"),
    (body(tensor("x", "FP32", [1], [True])), None, InvalidInput, "FP32 data must be numbers, got true/false"),
    (body(tensor("x", "FP32", [2], [1.0, 1e39])), None, InvalidInput, "values out of range for FP32"),
    (body(tensor("x", "FP16", [1], [70000])), None, InvalidInput, "values out of range for FP16"),
    (body(tensor("x", "FP16", [2], [1, -(2**63)])), None, InvalidInput, "values out of range for FP16"),
    (body(tensor("x", "FP32", [1], [-3.5e38])), None, InvalidInput, "values out of range for FP32"),
    (body(tensor("x", "INT64", [1], [1e20])), None, InvalidInput, "values out of range for INT64"),
    (body(tensor("x", "FP32", [1], ["a"])), None, InvalidInput, "FP32 data must be numbers"),
    (body(tensor("x", "BOOL", [1], [1])), None, InvalidInput, "BOOL data must be true/false"),
    (body(tensor("x", "BYTES", [1], [1])), None, InvalidInput, "BYTES data must be strings"),
    (body({"name": "x", "datatype": "FP32", "shape": [1]}), None, InvalidInput, "has no 'data'"),
    (body(tensor("x", "FP32", [1], [1]), tensor("x", "FP32", [1], [1])), None, InvalidInput, "appears twice"),
    (body(tensor("x", "FP32", [1], [1]), id=5), None, InvalidInput, "'id' must be a string"),
    (
        body(tensor("x", "FP32", [1], [1]), parameters=[]),
        None,
        InvalidInput,
        "'parameters' must be an object",
    ),
    (body(tensor("x", "FP32", [1], [1]), outputs="y"), None, InvalidInput, "'outputs' must be a list"),
    (body(tensor("x", "FP32", [1], [1]), outputs=[{"n": 1}]), None, InvalidInput, "needs a 'name' string"),
    (
        body(tensor("x", "FP32", [1], [1]), parameters={"binary_data_output": "yes"}),
        None,
        InvalidInput,
        "'binary_data_output' must be a boolean",
    ),
    (body(tensor("x", "FP32", [1], [1])), 10_000, BadRequest, "Inference-Header-Content-Length is 10000"),
]


@pytest.mark.parametrize(("payload", "head", "error", "message"), BAD_REQUESTS)
def test_malformed_requests_are_refused_with_a_reason(
    payload: bytes, head: int | None, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        decode_request(payload, head)


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT64", [1, 2**70], "values out of range for INT64"),
        ("UINT64", [2**64], "values out of range for UINT64"),
        ("INT64", [-1, 2**63], "values out of range for INT64"),
        ("FP64", [2**1100], "values out of range for FP64"),
        ("FP32", [1, "a"], "FP32 data must be numbers, got strings"),
    ],
)
def test_python_integers_beyond_64_bits_are_refused(datatype: str, data: list[Any], message: str) -> None:
    # Parsers other than orjson (the standard json module) give exact Python ints past 64 bits.
    with pytest.raises(InvalidInput, match=message):
        array_from_json("x", datatype, V2_TO_NUMPY[datatype], data)


def test_exact_large_integers_are_kept() -> None:
    assert array_from_json("x", "UINT64", V2_TO_NUMPY["UINT64"], [2**64 - 1]).tolist() == [2**64 - 1]
    assert array_from_json("x", "FP32", V2_TO_NUMPY["FP32"], [2**70]).tolist() == [float(2**70)]


def _binary_input(size: int, datatype: str = "FP32", shape: list[int] | None = None) -> dict[str, Any]:
    return {
        "name": "x",
        "datatype": datatype,
        "shape": shape or [2],
        "parameters": {"binary_data_size": size},
    }


@pytest.mark.parametrize(
    ("tensor_json", "tail", "error", "message"),
    [
        (_binary_input(8), b"\0" * 4, BadRequest, "claims 8 binary bytes but only 4 remain"),
        (_binary_input(4), b"\0" * 4, InvalidInput, "shape needs 8 bytes, 'binary_data_size' is 4"),
        (
            _binary_input(8),
            b"\0" * 12,
            BadRequest,
            "4 bytes of binary data follow the JSON but no input claims them",
        ),
        (_binary_input(-1), b"", InvalidInput, "'binary_data_size' must be a non-negative integer"),
        ({**_binary_input(8), "data": [1, 2]}, b"\0" * 8, InvalidInput, "both 'data' and 'binary_data_size'"),
        (_binary_input(6, "BYTES", [1]), struct.pack("<I", 9) + b"ab", InvalidInput, "overruns"),
        (_binary_input(2, "BYTES", [1]), b"ab", InvalidInput, "truncated BYTES element length"),
        (
            _binary_input(5, "BYTES", [2]),
            struct.pack("<I", 1) + b"a",
            InvalidInput,
            "needs 2 elements, binary data has 1",
        ),
    ],
)
def test_malformed_binary_framing_is_refused(
    tensor_json: dict[str, Any], tail: bytes, error: type[Exception], message: str
) -> None:
    head = orjson.dumps({"inputs": [tensor_json]})
    with pytest.raises(error, match=message):
        decode_request(head + tail, len(head))


def test_non_utf8_bytes_outputs_must_be_requested_as_binary() -> None:
    array = np.array([b"\xff\xfe"], dtype=object)
    with pytest.raises(InvalidInput, match="request it with binary_data: true"):
        encode_response("m", "1", {"y": array}, InferenceRequest(inputs={}))
    payload, head = encode_response("m", "1", {"y": array}, InferenceRequest(inputs={}, binary_default=True))
    assert head is not None and payload.endswith(b"\xff\xfe")


@pytest.mark.parametrize("rows", [[1] * 600, [2] * 600, [1] * 5])
def test_many_alike_requests_get_the_rows_plain_slices_give(rows: list[int]) -> None:
    total = sum(rows)  # 600 alike requests take the reshaping path, 5 the slices
    stacked = {
        "label": np.arange(total, dtype=np.int64),
        "scores": np.arange(3 * total, dtype=np.float32).reshape(-1, 3),
    }
    bounds = np.cumsum([0, *rows])
    pieces = slice_rows(stacked, rows)
    assert len(pieces) == len(rows)
    for j, piece in enumerate(pieces):
        for name, array in stacked.items():
            np.testing.assert_array_equal(piece[name], array[bounds[j] : bounds[j + 1]])


@pytest.mark.parametrize("rows", [[1] * 6, [2, 2, 2], [1, 2, 3], [6], [3, 0, 3]])
def test_a_stack_packed_in_one_pass_is_each_requests_rows_packed_alone(rows: list[int]) -> None:
    stacked = {
        "label": np.arange(6, dtype=np.int64),
        "probabilities": np.arange(60, dtype=np.float32).reshape(6, 10),
        "half": np.arange(12, dtype=np.float16).reshape(6, 2)[::-1],  # not contiguous
    }
    alone = [pack_arrays(part) for part in slice_rows(stacked, rows)]
    assert pack_rows(stacked, rows) == alone
    assert slice_rows({}, rows) == [{}] * len(rows)  # no arrays: still a piece per request
    bounds = np.cumsum([0, *rows])
    for j, blob in enumerate(alone):  # and each unpacks to exactly its rows
        back = unpack_arrays(blob)
        for name, array in stacked.items():
            np.testing.assert_array_equal(back[name], array[bounds[j] : bounds[j + 1]])
            assert back[name].dtype == array.dtype


def test_a_stack_of_strings_is_packed_element_by_element() -> None:
    stacked = {"label": np.array([b"seven", b"one", b"x" * 40], dtype=object), "n": np.arange(3, dtype=np.int32)}
    assert pack_rows(stacked, [1, 2]) == [pack_arrays(part) for part in slice_rows(stacked, [1, 2])]
    assert unpack_arrays(pack_rows(stacked, [1, 1, 1])[2])["label"].tolist() == [b"x" * 40]


def decoded(payload: bytes, head: int | None) -> Any:
    """What decode_request makes of a body: the request's fields and inputs, or the error's type and message."""
    try:
        request = decode_request(payload, head)
    except (BadRequest, InvalidInput) as exc:
        return type(exc), str(exc)
    inputs = {
        name: (a.dtype, a.shape, a.tobytes() if a.dtype != object else a.tolist()) for name, a in request.inputs.items()
    }
    return inputs, request.id, request.parameters, request.outputs, request.binary_outputs, request.timeout


def _json_data(array: np.ndarray) -> Any:
    return [v.decode() for v in array.ravel()] if array.dtype == object else array.tolist()


_GOOD_ROWS = np.random.default_rng(1).normal(size=(40, 64)).astype(np.float32)
# Bodies for simdjson's reading of JSON numbers beside orjson's: the malformed ones above, and more.
READ_BOTH_WAYS: dict[str, tuple[bytes, int | None]] = {
    **{f"bad-{i}": (payload, head) for i, (payload, head, _, _) in enumerate(BAD_REQUESTS)},
    **{
        f"json-{datatype}": (body(tensor("x", datatype, list(a.shape), _json_data(a))), None)
        for datatype, a in sample_arrays().items()
    },
    "fp32-rows": (body(tensor("x", "FP32", [40, 64], _GOOD_ROWS.ravel().tolist())), None),
    "past-the-kept-parser": (body(tensor("x", "FP32", [1000, 64], np.resize(_GOOD_ROWS, 64_000).tolist())), None),
    "fp64-precise": (
        body(tensor("x", "FP64", [6], [0.1, 1 / 3, 2.0**-1074, 1.7976931348623157e308, -0.0, 2**53 + 1])),
        None,
    ),
    "fp32-rounding": (body(tensor("x", "FP32", [4], [0.1, 16777217, 3.4028235e38, 1.401298464324817e-45])), None),
    "fp16-too-big": (body(tensor("x", "FP16", [2], [1.0, 65520.0])), None),
    "int64-extremes": (body(tensor("x", "INT64", [2], [2**63 - 1, -(2**63)])), None),
    "uint64-extremes": (body(tensor("x", "UINT64", [2], [2**64 - 1, 2**63 + 1])), None),
    "uint8-negative": (body(tensor("x", "UINT8", [2], [1, -1])), None),
    "bools-among-floats": (body(tensor("x", "FP32", [3], [1.5, True, False])), None),
    "nested": (body(tensor("x", "FP32", [2, 2], [[1, 2], [3, 4]])), None),
    "ragged-same-count": (body(tensor("x", "FP32", [2], [[1.0], 2.0])), None),
    "ragged-empty": (body(tensor("x", "FP32", [3], [[], 1.0, [2.0, 3.0]])), None),
    "empty": (body(tensor("x", "FP32", [0], [])), None),
    "a-scalar": (body(tensor("x", "FP32", [], 1.5)), None),
    "data-twice": (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2], "data": [3, 4]}]}',
        None,
    ),
    "id-twice": (
        b'{"id": "a", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}], "id": "b"}',
        None,
    ),
    "inputs-twice": (b'{"inputs": 5, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}', None),
    "a-bracket-in-a-name": (body(tensor("x[0]", "FP32", [2], [1.0, 2.0])), None),
    "an-escaped-bracket": (
        b'{"inputs": [{"name": "x\\u005b", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}',
        None,
    ),
    "lists-in-parameters": (body(tensor("x", "FP32", [2], [1.0, 2.0]), parameters={"a": [[1], [2, [3]]]}), None),
    "everything": (
        body(
            tensor("x", "INT32", [2], [1, 2]),
            tensor("y", "BYTES", [2], ["a", "b"]),
            tensor("z", "BOOL", [2], [True, False]),
            id="req-1",
            parameters={"binary_data_output": True, "timeout": 5000},
            outputs=[{"name": "a", "parameters": {"binary_data": False}}, {"name": "b"}],
        ),
        None,
    ),
    "with-binary": binary_body({"b": ("FP32", np.arange(4, dtype=np.float32))}),
}


@pytest.mark.parametrize(("payload", "head"), READ_BOTH_WAYS.values(), ids=READ_BOTH_WAYS.keys())
def test_json_numbers_read_by_simdjson_decode_as_orjson_reads_them(
    payload: bytes, head: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tensors, "NUMBERS_READ_FROM", 10**12)
    by_orjson = decoded(payload, head)
    monkeypatch.setattr(tensors, "NUMBERS_READ_FROM", 0)
    assert decoded(payload, head) == by_orjson


def test_large_requests_numbers_are_read_by_simdjson() -> None:
    """The bodies it takes are read by it (the test above would pass if none were)."""
    assert len(READ_BOTH_WAYS["past-the-kept-parser"][0]) > tensors._KEPT_PARSER_BYTES  # read by a parser of its own
    for name in (
        "fp32-rows",
        "past-the-kept-parser",
        "fp64-precise",
        "int64-extremes",
        "everything",
        "lists-in-parameters",
    ):
        doc = tensors.read_numbers(READ_BOTH_WAYS[name][0])
        assert doc is not None and isinstance(doc["inputs"][0]["data"], tensors.Numbers), name
    for name in ("nested", "ragged-same-count", "data-twice", "a-bracket-in-a-name", "bools-among-floats"):
        assert tensors.read_numbers(READ_BOTH_WAYS[name][0]) is None, name
    assert len(READ_BOTH_WAYS["fp32-rows"][0]) >= tensors.NUMBERS_READ_FROM  # what decode_request reads so


# Inputs of the common form and of others, as a request's body or a job's message holds them.
COMMON_FORM = {
    "one": [tensor("x", "FP32", [1, 2], [1.5, 2])],
    "two": [tensor("x", "INT64", [1, 2], [1, 2]), tensor("y", "UINT8", [3], [1, 2, 3])],
}
OTHER_FORMS = {
    "nested-data": [tensor("x", "FP32", [2, 2], [[1, 2], [3, 4]])],
    "nested-shape": [tensor("x", "FP32", [[2], 1], [1, 2])],
    "a-bracket-in-a-name": [tensor("x[0]", "FP32", [2], [1, 2])],
    "another-key": [tensor("x", "FP32", [2], [1, 2]) | {"parameters": {}}],
    "no-data": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}],
    "bools": [tensor("x", "BOOL", [2], [True, False])],
    "a-scalar": [tensor("x", "FP32", [], 1.5)],
    "not-an-object": [5],
    "one-of-two": [tensor("x", "FP32", [2], [1, 2]), tensor("y", "BYTES", [1], ["a"])],
}


@pytest.mark.parametrize("inputs", COMMON_FORM.values(), ids=COMMON_FORM.keys())
def test_inputs_of_the_common_form_are_read_into_buffers(inputs: list[dict[str, Any]]) -> None:
    text = body(*inputs, outputs=[{"name": "y"}])
    read = tensors.read_inputs(text, simdjson.Parser().parse(text)["inputs"], lists=1)
    assert read is not None
    heads, buffers = read
    assert [(name, datatype, orjson.loads(shape), count) for name, datatype, shape, count in heads] == [
        (t["name"], t["datatype"], t["shape"], len(t["data"])) for t in inputs
    ]
    for t, buffer in zip(inputs, buffers, strict=True):
        dtype = V2_TO_NUMPY[t["datatype"]]
        assert tensors.numbers_column("x", t["datatype"], dtype, [buffer, buffer]).tolist() == t["data"] * 2


@pytest.mark.parametrize("inputs", OTHER_FORMS.values(), ids=OTHER_FORMS.keys())
def test_inputs_of_another_form_are_left_to_other_readers(inputs: list[Any]) -> None:
    text = body(*inputs)
    assert tensors.read_inputs(text, simdjson.Parser().parse(text)["inputs"], lists=0) is None


def test_numbers_a_column_cannot_hold_are_refused() -> None:
    text = body(tensor("x", "INT8", [2], [1, 128]))
    read = tensors.read_inputs(text, simdjson.Parser().parse(text)["inputs"], lists=0)
    assert read is not None
    with pytest.raises(InvalidInput, match="values out of range for INT8"):
        tensors.numbers_column("x", "INT8", np.dtype(np.int8), read[1])
