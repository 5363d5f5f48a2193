"""Open Inference Protocol V2 tensor codec: JSON and Triton's binary tensor extension <-> numpy.

Decoding and encoding stay in numpy and orjson (C) on the hot path: ``np.asarray`` on the
JSON data, ``np.frombuffer`` on binary data, ``orjson`` with numpy serialisation on the way
out. Only BYTES tensors, which are per-element by nature, loop in Python.
"""

from __future__ import annotations

import functools
import math
import struct
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import orjson
import simdjson

from fnserve.core.codec.rows import slice_rows
from fnserve.core.errors import BadRequest, InvalidInput
from fnserve.core.models.datatypes import V2_TO_NUMPY, v2_datatype

JSON_HEADER = "inference-header-content-length"
_LE: Final = "<"
_U32 = struct.Struct("<I")
_DUMP_OPTS = orjson.OPT_SERIALIZE_NUMPY
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_MAX, _MIN = np.maximum.reduce, np.minimum.reduce  # over every axis; ndarray.max adds a Python call
_SHORT = 256  # elements
_FLOAT_MAX = {4: float(np.finfo(np.float32).max), 2: float(np.finfo(np.float16).max)}  # by item size

# The buffer type simdjson reads a tensor's JSON numbers into, by datatype: what each number must be (a float
# type takes any number; an integer type only whole numbers written without a fraction or an exponent).
BUFFER_TYPE = {"FP16": "d", "FP32": "d", "FP64": "d"} | {
    f"{kind}{bits}": code for kind, code in (("INT", "i"), ("UINT", "u")) for bits in (8, 16, 32, 64)
}
BUFFER_DTYPE = {"d": np.dtype(np.float64), "i": np.dtype(np.int64), "u": np.dtype(np.uint64)}
# simdjson's proxies of a JSON object and list (Any: a type check does not narrow them for the type checker).
SIMDJSON_OBJECT: Any = simdjson.Object
SIMDJSON_ARRAY: Any = simdjson.Array
# A request body's JSON of this many bytes or more has its tensors' numbers read by simdjson (read_numbers);
# below it, orjson's parse costs less than reading the fields through simdjson's proxies does, above it simdjson
# wins by more the longer the body (where the two cross: docs/design/codec.md).
NUMBERS_READ_FROM = 2048
# A simdjson parser a thread, reused for bodies up to _KEPT_PARSER_BYTES: it keeps the memory it grew to (a few
# times the largest body it read), so a larger body gets a parser of its own, freed after.
_parsers = threading.local()
_KEPT_PARSER_BYTES = 1024 * 1024


@dataclass(slots=True)
class InferenceRequest:
    """A decoded V2 inference request."""

    inputs: dict[str, np.ndarray[Any, Any]]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] | None = None  # requested output names, None for all
    binary_outputs: dict[str, bool] = field(default_factory=dict)  # per requested output
    binary_default: bool = False  # request's binary_data_output
    timeout: float | None = None  # seconds the client waits (Triton's request parameter "timeout", in µs)

    def wants_binary(self, name: str) -> bool:
        return self.binary_outputs.get(name, self.binary_default)


def decode_request(body: bytes, json_length: int | None = None) -> InferenceRequest:
    """Parse a V2 request body; ``json_length`` is the Inference-Header-Content-Length value."""
    if json_length is None:
        head, binary = body, b""
    else:
        if json_length < 0 or json_length > len(body):
            raise BadRequest(f"Inference-Header-Content-Length is {json_length} but the body has {len(body)} bytes")
        head, binary = body[:json_length], body[json_length:]
    doc = read_numbers(head) if len(head) >= NUMBERS_READ_FROM else None
    return decode_document(doc if doc is not None else json_object(head, "request body"), binary)


def json_object(data: bytes | str, what: str) -> dict[str, Any]:
    """``data`` parsed as a JSON object, or a 400 saying what is wrong with ``what``."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return doc


@dataclass(frozen=True, slots=True)
class Numbers:
    """A tensor's JSON numbers as simdjson read them, flat: float64, int64 or uint64 (``BUFFER_TYPE``)."""

    values: np.ndarray[Any, Any]


def read_numbers(head: bytes) -> dict[str, Any] | None:
    """A request's JSON as orjson reads it, but with each input's numbers read by simdjson straight into an
    array (:class:`Numbers`): no Python number made for each, so a large tensor decodes in a fraction of
    orjson's and numpy's time. None where that reading would differ from orjson's in any way: a value its datatype's
    buffer refuses (a string, ``null``, a fraction for an integer type, an integer past 64 bits), nested
    lists, a key twice, or not JSON; orjson then reads it and the decoder says what is wrong.

    Nested data is found by count: every ``[`` in the text is a list read here, unless data is nested (simdjson
    flattens it into its buffer, one list counted) or a string holds one (which sends the body to orjson too)."""
    parser: Any
    if len(head) > _KEPT_PARSER_BYTES:
        parser = simdjson.Parser()
    else:
        parser = getattr(_parsers, "parser", None) or _new_parser()
    try:
        doc = parser.parse(head)
        if type(doc) is not SIMDJSON_OBJECT:
            return None
        out: dict[str, Any] = {}
        lists = 0
        inputs = None
        for key in keys_once(doc):
            value = doc[key]
            if key == "inputs" and type(value) is SIMDJSON_ARRAY:
                out[key] = inputs = value  # read once the other keys' lists are counted
            else:
                out[key] = plain = _plain(value)
                lists += _lists(plain)
        if inputs is not None:
            read = read_inputs(head, inputs, lists)
            if read is not None:  # every input of the common form
                out["inputs"] = [
                    {
                        "name": name,
                        "datatype": datatype,
                        "shape": orjson.loads(shape),
                        "data": Numbers(_numbers(datatype, buffer)),
                    }
                    for (name, datatype, shape, _), buffer in zip(*read, strict=True)
                ]
                return out
            tensors = []  # one of another form: read one by one, each as orjson would
            for tensor in inputs:
                entry, tensor_lists = _read_other_tensor(tensor)
                tensors.append(entry)
                lists += tensor_lists
            out["inputs"], lists = tensors, lists + 1
        if head.count(b"[") != lists:
            return None
    except Exception:  # noqa: BLE001 - whatever simdjson reads otherwise than orjson (or not at all), orjson reads
        return None
    return out


def _new_parser() -> Any:
    _parsers.parser = simdjson.Parser()
    return _parsers.parser


# The keys of a tensor of the common form (read_inputs), and its lists: shape and data.
_TENSOR_KEYS, _TENSOR_LISTS = 4, 2


def read_inputs(
    text: str | bytes, inputs: Any, lists: int
) -> tuple[list[tuple[str, str, bytes, int]], list[Any]] | None:
    """The input tensors (``inputs``, a simdjson list) of the JSON ``text``, where each is of the common form
    (name, datatype, shape and data alone; numbers; nothing nested): each one's head (name, datatype, shape as
    JSON text, count of numbers) and its numbers in a buffer of ``BUFFER_TYPE[datatype]``, no Python number made
    for each. ``lists``: how many lists ``text`` holds outside the inputs. None where one is of another form; a
    ValueError where a number is not of its buffer's type.

    Heads are of exact types (``1.0 == 1`` in Python, not so their texts): tensors of equal heads are alike.
    Nesting is found by count: a buffer flattens nested data, so the text holds more ``[`` than the lists read
    (as it does where a string holds one)."""
    heads = []
    buffers = []
    for tensor in inputs:
        if type(tensor) is not SIMDJSON_OBJECT or len(tensor) != _TENSOR_KEYS:
            return None
        try:
            name, datatype, shape, data = tensor["name"], tensor["datatype"], tensor["shape"], tensor["data"]
            code = BUFFER_TYPE[datatype]
        except (KeyError, TypeError):  # another key in place of one of these, or a datatype of no buffer
            return None
        if type(name) is not str or type(shape) is not SIMDJSON_ARRAY or type(data) is not SIMDJSON_ARRAY:
            return None
        heads.append((name, datatype, shape.mini, len(data)))
        buffers.append(data.as_buffer(of_type=code))
    brackets = text.count("[") if isinstance(text, str) else text.count(b"[")
    if brackets != lists + 1 + _TENSOR_LISTS * len(heads):
        return None
    return heads, buffers


def numbers_column(name: str, datatype: str, dtype: np.dtype[Any], buffers: Sequence[Any]) -> np.ndarray[Any, Any]:
    """Tensors' numbers of one ``datatype`` (:func:`read_inputs`' buffers) as one flat array of ``dtype``, refusing
    those it cannot hold."""
    return numbers_as(name, datatype, dtype, _numbers(datatype, b"".join(buffers)))


def _numbers(datatype: str, buffer: Any) -> np.ndarray[Any, Any]:
    """A buffer of ``datatype``'s numbers (:func:`read_inputs`') as a flat array, a view of it."""
    return np.frombuffer(buffer, BUFFER_DTYPE[BUFFER_TYPE[datatype]])


def _read_other_tensor(tensor: Any) -> tuple[dict[str, Any], int]:
    """An input of :func:`read_numbers` of another form than :func:`read_inputs` reads, and how many lists it holds
    (a ValueError where it cannot be read so)."""
    if type(tensor) is not SIMDJSON_OBJECT:
        raise ValueError("a tensor not an object")
    entry: dict[str, Any] = {}
    lists = 0
    keys = keys_once(tensor)
    for key in keys:
        if key != "data":
            entry[key] = plain = _plain(tensor[key])
            lists += _lists(plain)
    found = "data" in keys
    data: Any = tensor["data"] if found else None
    datatype = entry.get("datatype")
    code = BUFFER_TYPE.get(datatype) if type(datatype) is str else None
    if code is not None and type(data) is SIMDJSON_ARRAY:
        # as_buffer refuses another type of value, and flattens nested lists (counted as one: see read_numbers)
        entry["data"] = Numbers(np.frombuffer(data.as_buffer(of_type=code), BUFFER_DTYPE[code]))
        lists += 1
    elif found:
        entry["data"] = plain = _plain(data)
        lists += _lists(plain)
    return entry, lists


def keys_once(obj: Any) -> list[str]:
    """A simdjson object's keys; a ValueError where one is there twice (orjson keeps the last, a lookup finds the
    first)."""
    keys = list(obj)
    if len(set(keys)) != len(keys):
        raise ValueError("a key twice")
    return keys


def _plain(value: Any) -> Any:
    """A simdjson value as Python values, as orjson reads it."""
    if type(value) is SIMDJSON_OBJECT:
        return value.as_dict()
    if type(value) is SIMDJSON_ARRAY:
        return value.as_list()
    return value


def _lists(value: Any) -> int:
    """How many lists ``value`` is and holds."""
    if type(value) is list:
        return 1 + sum(_lists(v) for v in value if type(v) is list or type(v) is dict)
    if type(value) is dict:
        return sum(_lists(v) for v in value.values() if type(v) is list or type(v) is dict)
    return 0


def decode_document(doc: dict[str, Any], binary: bytes = b"") -> InferenceRequest:
    """A V2 request from its parsed JSON object (and the binary tensors that followed it)."""
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    request = InferenceRequest(inputs={})
    if (req_id := doc.get("id")) is not None:
        if not isinstance(req_id, str):
            raise InvalidInput("'id' must be a string")
        request.id = req_id
    if (params := doc.get("parameters")) is not None:  # most requests carry none
        request.parameters = _parameters(params, "request")
        binary_default = params.get("binary_data_output", False)
        if not isinstance(binary_default, bool):
            raise InvalidInput("parameter 'binary_data_output' must be a boolean")
        request.binary_default = binary_default
        request.timeout = request_timeout(params.get("timeout"))
    offset = 0
    for raw in raw_inputs:
        name, array, offset = _decode_input(raw, binary, offset)
        if name in request.inputs:
            raise InvalidInput(f"input {name!r} appears twice")
        request.inputs[name] = array
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data follow the JSON but no input claims them")
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        request.outputs = _decode_outputs(raw_outputs, request)
    return request


def request_timeout(value: Any) -> float | None:
    """Triton's ``timeout`` request parameter (microseconds; 0 or none: no timeout) in seconds: how long the
    request may take, queued for a batch included; past it, it is dropped before it runs (a 504)."""
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"parameter 'timeout' is microseconds, a non-negative integer; got {value!r}")
    return value / 1e6


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} 'parameters' must be an object")
    return value


def _decode_input(raw: Any, binary: bytes, offset: int) -> tuple[str, np.ndarray[Any, Any], int]:
    if not isinstance(raw, dict):
        raise InvalidInput("each input must be an object with name, shape, datatype and data")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("each input needs a 'name' string")
    datatype = raw.get("datatype")
    dtype = V2_TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise InvalidInput(f"input {name!r}: unknown datatype {datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}")
    shape = raw.get("shape")
    if type(shape) is not list:
        raise InvalidInput(f"input {name!r}: 'shape' must be a list of non-negative integers")
    for d in shape:  # a loop, not all() over a generator: cheaper for the two or three of a shape
        if type(d) is not int or d < 0:
            raise InvalidInput(f"input {name!r}: 'shape' must be a list of non-negative integers")
    size = math.prod(shape)
    params = raw.get("parameters")
    nbytes = None if params is None else _parameters(params, f"input {name!r}").get("binary_data_size")
    if nbytes is not None:
        if type(nbytes) is not int or nbytes < 0:
            raise InvalidInput(f"input {name!r}: 'binary_data_size' must be a non-negative integer")
        if "data" in raw:
            raise InvalidInput(f"input {name!r} has both 'data' and 'binary_data_size'")
        if offset + nbytes > len(binary):
            raise BadRequest(f"input {name!r} claims {nbytes} binary bytes but only {len(binary) - offset} remain")
        chunk = binary[offset : offset + nbytes]
        array = from_binary(name, datatype, dtype, chunk, size)  # type: ignore[arg-type]
        return name, array.reshape(shape), offset + nbytes
    if "data" not in raw:
        raise InvalidInput(f"input {name!r} has no 'data' (and no 'binary_data_size')")
    data = raw["data"]
    if type(data) is Numbers:  # read already (read_numbers)
        array = numbers_as(name, datatype, dtype, data.values)  # type: ignore[arg-type]
    else:
        array = array_from_json(name, datatype, dtype, data)  # type: ignore[arg-type]
    if array.size != size:
        raise InvalidInput(f"input {name!r}: shape {shape} needs {size} elements, data has {array.size}")
    return name, array.reshape(shape), offset


_WHOLE_LOW, _WHOLE_HIGH = -(2.0**63), 2.0**64  # the whole numbers orjson reads as ints lie in [-2**63, 2**64)


def array_from_json(name: str, datatype: str, dtype: np.dtype[Any], data: Any) -> np.ndarray[Any, Any]:
    """JSON ``data`` (flat or nested lists) as an array of ``datatype``; values must fit it exactly."""
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat = _flatten(data)
        if not all(isinstance(v, str) for v in flat):
            raise InvalidInput(f"input {name!r}: BYTES data must be strings")
        out = np.empty(len(flat), dtype=object)
        out[:] = [v.encode() for v in flat]
        return out
    try:
        raw = np.asarray(data)
    except ValueError:
        raise InvalidInput(f"input {name!r}: 'data' is a ragged nested list") from None
    if raw.dtype == dtype and dtype.kind in "iu":  # whole numbers that numpy read as this very type: they fit
        return raw
    kind = raw.dtype.kind
    if raw.size == 0:
        return raw.astype(dtype)
    if dtype.kind == "b":
        if kind != "b":
            raise InvalidInput(f"input {name!r}: BOOL data must be true/false")
        return raw
    if kind == "O" and all(type(v) is int or type(v) is float for v in _flatten(data)):
        # Integers beyond 64 bits: numpy keeps them as Python objects.
        if dtype.kind in "iu":
            raise InvalidInput(f"input {name!r}: values out of range for {datatype}")
        try:
            raw, kind = np.asarray(data, dtype=np.float64), "f"
        except OverflowError:
            raise InvalidInput(f"input {name!r}: values out of range for {datatype}") from None
    if kind not in "iuf":
        got = {"b": "true/false", "U": "strings"}.get(kind, "other values (strings, objects or nulls)")
        raise InvalidInput(f"input {name!r}: {datatype} data must be numbers, got {got}")
    if dtype.kind in "iu":
        if kind == "f":
            flat = _flatten(data)
            # orjson reads a whole number as an int from -2**63 up to 2**64 - 1 and past them as a float: a float
            # inside that span was written as one (1.0, 2.5), one outside it is a whole number out of range.
            if any(type(v) is float and (_WHOLE_LOW < v < _WHOLE_HIGH or not v.is_integer()) for v in flat):
                raise InvalidInput(f"input {name!r}: {datatype} data must be integers, got floats")
            if datatype == "UINT64" and all(type(v) is int for v in flat):
                # numpy infers float64 for ints past int64's range; build it exactly instead.
                return _exact_uint64(name, data)
            raise InvalidInput(f"input {name!r}: values out of range for {datatype}")
    return numbers_as(name, datatype, dtype, raw, data)


def numbers_as(
    name: str, datatype: str, dtype: np.dtype[Any], raw: np.ndarray[Any, Any], data: Any = None
) -> np.ndarray[Any, Any]:
    """Numbers as read (``raw``: whole numbers as integers, and floats where ``dtype`` is a float type) as
    ``dtype``, refusing those it cannot hold (a float type's would become infinities). ``data``: the JSON list
    they were read from, whose max and min cost less than numpy's when it is short."""
    top: float  # or int: an integer type's, compared exactly
    bottom: float
    if raw.size == 0:
        return raw.astype(dtype)
    if dtype.kind in "iu":
        if raw.dtype == dtype:  # read as this very type: they fit
            return raw
        info = np.iinfo(dtype)
        top, bottom = info.max, info.min
    elif dtype.itemsize < 8:  # FP32, FP16: checked before the cast, which would warn
        top = _FLOAT_MAX[dtype.itemsize]
        bottom = -top
    else:
        return raw.astype(dtype, copy=False)
    if data is not None and raw.ndim == 1 and raw.size <= _SHORT:
        high, low = max(data), min(data)
    else:
        high, low = _MAX(raw, None), _MIN(raw, None)
        if raw.dtype.kind in "iu":  # Python ints: no overflow in the comparison
            high, low = int(high), int(low)
    if high > top or low < bottom:
        raise InvalidInput(f"input {name!r}: values out of range for {datatype}")
    return raw.astype(dtype)


def _exact_uint64(name: str, data: list[Any]) -> np.ndarray[Any, Any]:
    try:
        return np.asarray(data, dtype=np.uint64)
    except OverflowError:
        raise InvalidInput(f"input {name!r}: values out of range for UINT64") from None


def _flatten(data: list[Any]) -> list[Any]:
    if not any(isinstance(v, list) for v in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def from_binary(name: str, datatype: str, dtype: np.dtype[Any], chunk: bytes, size: int) -> np.ndarray[Any, Any]:
    """``size`` elements of ``datatype`` from the binary extension's bytes (a view of ``chunk``, BYTES aside)."""
    if datatype == "BYTES":
        items = _split_bytes(name, chunk)
        if len(items) != size:
            raise InvalidInput(f"input {name!r}: shape needs {size} elements, binary data has {len(items)}")
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out
    if len(chunk) != size * dtype.itemsize:
        raise InvalidInput(
            f"input {name!r}: {datatype} shape needs {size * dtype.itemsize} bytes, 'binary_data_size' is {len(chunk)}"
        )
    return np.frombuffer(chunk, dtype=dtype.newbyteorder(_LE))


def _split_bytes(name: str, chunk: bytes) -> list[bytes]:
    items = []
    pos, end = 0, len(chunk)
    while pos < end:
        if pos + 4 > end:
            raise InvalidInput(f"input {name!r}: truncated BYTES element length")
        (length,) = _U32.unpack_from(chunk, pos)
        pos += 4
        if pos + length > end:
            raise InvalidInput(f"input {name!r}: BYTES element overruns the binary data")
        items.append(chunk[pos : pos + length])
        pos += length
    return items


def _decode_outputs(raw_outputs: Any, request: InferenceRequest) -> list[str]:
    if not isinstance(raw_outputs, list):
        raise InvalidInput("'outputs' must be a list")
    names = []
    for raw in raw_outputs:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput("each requested output needs a 'name' string")
        name = raw["name"]
        params = _parameters(raw.get("parameters"), f"output {name!r}")
        if "binary_data" in params:
            if not isinstance(params["binary_data"], bool):
                raise InvalidInput(f"output {name!r}: 'binary_data' must be a boolean")
            request.binary_outputs[name] = params["binary_data"]
        names.append(name)
    return names


def encode_response(
    model_name: str,
    model_version: str,
    outputs: Mapping[str, np.ndarray[Any, Any]],
    request: InferenceRequest,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """The response body and, when binary tensors follow the JSON, the JSON part's length."""
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        doc["id"] = request.id
    if parameters:
        doc["parameters"] = dict(parameters)
    tensors = []
    blobs = []
    for name, array in outputs.items():
        datatype = v2_datatype(array.dtype)
        if request.wants_binary(name):
            blob = binary_tensor(array, datatype)
            tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor = json_tensor(name, array, datatype)
        tensors.append(tensor)
    doc["outputs"] = tensors
    head = orjson.dumps(doc, option=_DUMP_OPTS)
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


def json_tensor(name: str, array: np.ndarray[Any, Any], datatype: str | None = None) -> dict[str, Any]:
    """A V2 output tensor with its data as JSON (orjson serialises the numpy data itself); ``datatype``: the
    array's V2 datatype, where the caller has it already."""
    datatype = datatype or v2_datatype(array.dtype)
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": _to_json(name, array, datatype)}


def _to_json(name: str, array: np.ndarray[Any, Any], datatype: str) -> Any:
    if datatype == "BYTES":
        try:
            return [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output {name!r} holds bytes that are not UTF-8; request it with binary_data: true"
            ) from None
    if datatype == "FP16":
        array = array.astype(np.float32)
    return np.ascontiguousarray(array).ravel()


def binary_tensor(array: np.ndarray[Any, Any], datatype: str) -> bytes:
    """The binary tensor extension's bytes of ``array``: little-endian, C order; BYTES length-prefixed."""
    if datatype == "BYTES":
        parts = []
        for v in array.ravel():
            item = v if isinstance(v, bytes) else str(v).encode()
            parts.append(_U32.pack(len(item)))
            parts.append(item)
        return b"".join(parts)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and _BIG_ENDIAN_HOST):
        array = array.astype(array.dtype.newbyteorder(_LE))
    return array.tobytes()  # C order, whatever the strides


def pack_arrays(arrays: Mapping[str, np.ndarray[Any, Any]]) -> bytes:
    """Arrays to one self-describing blob (a length-prefixed JSON header, then binary tensors).

    The same little-endian framing as the binary extension; used to store results.
    """
    spec = []
    blobs = []
    for name, array in arrays.items():
        datatype = v2_datatype(array.dtype)
        blob = binary_tensor(array, datatype)
        spec.append((name, datatype, array.shape, len(blob)))
        blobs.append(blob)
    return b"".join([_packed_header(tuple(spec)), *blobs])


def pack_rows(arrays: Mapping[str, np.ndarray[Any, Any]], rows: Sequence[int]) -> list[bytes]:
    """:func:`pack_arrays` of each request's rows of stacked ``arrays`` (request ``j`` owns ``rows[j]`` rows),
    in one pass: each array's bytes made once and cut per request, one header per row count."""
    if any(array.dtype == object or array.ndim == 0 for array in arrays.values()):  # BYTES: element by element
        return [pack_arrays(part) for part in slice_rows(arrays, rows)]
    columns = []
    for name, array in arrays.items():
        datatype = v2_datatype(array.dtype)
        row_bytes = array.dtype.itemsize * math.prod(array.shape[1:])
        columns.append((name, datatype, array.shape[1:], row_bytes, binary_tensor(array, datatype)))
    count = len(rows)
    if count > 1 and rows.count(rows[0]) == count:  # alike: every payload the same size, cut from one buffer
        width = rows[0]
        spec = tuple((name, datatype, (width, *tail), width * size) for name, datatype, tail, size, _ in columns)
        header = _packed_header(spec)
        table = np.empty((count, len(header) + sum(width * c[3] for c in columns)), np.uint8)
        table[:, : len(header)] = np.frombuffer(header, np.uint8)
        at = len(header)
        for *_, size, blob in columns:
            table[:, at : at + width * size] = np.frombuffer(blob, np.uint8).reshape(count, width * size)
            at += width * size
        whole, step = table.tobytes(), table.shape[1]
        return [whole[j * step : (j + 1) * step] for j in range(count)]
    headers: dict[int, bytes] = {}
    out = []
    start = 0
    for own in rows:
        head = headers.get(own)
        if head is None:
            spec = tuple((name, datatype, (own, *tail), own * size) for name, datatype, tail, size, _ in columns)
            head = headers[own] = _packed_header(spec)
        end = start + own
        out.append(b"".join([head, *(blob[start * size : end * size] for _, _, _, size, blob in columns)]))
        start = end
    return out


@functools.lru_cache(maxsize=1024)
def _packed_header(spec: tuple[tuple[str, str, tuple[int, ...], int], ...]) -> bytes:
    # Batch results repeat one structure thousands of times: build its header once.
    head = orjson.dumps([[name, datatype, list(shape), size] for name, datatype, shape, size in spec])
    return _U32.pack(len(head)) + head


def unpack_arrays(blob: bytes) -> dict[str, np.ndarray[Any, Any]]:
    """The inverse of :func:`pack_arrays`."""
    (head_length,) = _U32.unpack_from(blob, 0)
    offset = 4 + head_length
    out = {}
    for name, datatype, shape, size in orjson.loads(blob[4:offset]):
        chunk = blob[offset : offset + size]
        offset += size
        out[name] = from_binary(name, datatype, V2_TO_NUMPY[datatype], chunk, math.prod(shape)).reshape(shape)
    if offset != len(blob):
        raise ValueError(f"packed arrays: {len(blob) - offset} trailing bytes")
    return out
