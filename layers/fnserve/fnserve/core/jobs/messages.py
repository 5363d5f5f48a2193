"""Batch jobs: the message format, parsing, and what a stored result looks like.

A job is a V2 inference request with the model named inside it::

    {"id": "job-42", "model": "digits-accurate", "version": "1",          # version optional
     "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [...]}],
     "outputs": [{"name": "label"}]}                                       # optional

or with its tensors in binary (Triton's binary tensor extension inside the message: each input
says its ``binary_data_size``, and ``binary_data`` holds their bytes one after the other,
base64-encoded; ``fnserve submit`` sends this form: exact, smaller than JSON numbers for
real-valued data, and parsed without reading a number)::

    {"id": "job-44", "model": "digits-accurate",
     "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": 256}}],
     "binary_data": "AAAAAAAAAEAAAFBB..."}

or, when the inputs are over SQS's message limit, a reference to an object holding the
V2 request body (JSON, or JSON then binary tensors with ``json_length`` set)::

    {"id": "job-43", "model": "digits-accurate", "payload": {"uri": "s3://bucket/key", "json_length": 187}}
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import orjson
import simdjson

from fnserve.core.codec.rows import slice_rows, take_rows
from fnserve.core.codec.tensors import (
    SIMDJSON_ARRAY,
    SIMDJSON_OBJECT,
    binary_tensor,
    decode_document,
    decode_request,
    json_object,
    keys_once,
    numbers_column,
    read_inputs,
)
from fnserve.core.errors import FnserveError, InferenceError, InvalidInput
from fnserve.core.models.datatypes import V2_TO_NUMPY, v2_datatype

logger = logging.getLogger(__name__)

# Room for cascade follow-up ids, which carry the cascade name and a signature.
_ID = r"[A-Za-z0-9_.:-]{1,200}"
JOB_ID = re.compile(_ID)  # fullmatch: "$" would let a trailing newline in
_JOB_IDS = re.compile(rf"{_ID}(?:\n{_ID})*")  # ids joined by newlines: a batch's checked in one call
# SQS's message size limit (1 MiB); bigger inputs travel by reference.
MAX_MESSAGE_BYTES = 1024 * 1024

PayloadLoader = Callable[[str], bytes]


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed job: who it is for and what to run."""

    id: str
    model: str
    version: str | None
    inputs: dict[str, np.ndarray[Any, Any]]
    outputs: tuple[str, ...] | None


def parse_job(body: str | bytes, load_payload: PayloadLoader | None = None) -> Job:
    """Parse one message body; every problem is a :class:`FnserveError` saying what is wrong."""
    doc = json_object(body, "job")
    job_id = doc.get("id")
    if not _is_id(job_id):
        raise InvalidInput("job needs an 'id' of 1-200 letters, digits, '.', '_', ':' or '-'")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput(f"job {job_id}: needs a 'model' string")
    version = doc.get("version")
    if version is not None and not isinstance(version, str):
        raise InvalidInput(f"job {job_id}: 'version' must be a string")
    try:
        payload, binary = doc.get("payload"), doc.get("binary_data")
        if payload is not None:
            if binary is not None:
                raise InvalidInput("a job has its tensors in 'payload' or in 'binary_data', not both")
            request = decode_request(*_referenced(job_id, payload, load_payload))
        else:
            request = decode_document(doc, _binary_data(binary))
    except FnserveError as exc:
        raise type(exc)(f"job {job_id}: {exc.message}", exc.status_code) from None
    outputs = tuple(request.outputs) if request.outputs is not None else None
    return Job(job_id, model, version, request.inputs, outputs)


def job_identity(body: str | bytes) -> tuple[str, str] | None:
    """(id, model) of a job that could not be parsed, where its body names a valid id (the model may be '')."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    job_id = doc.get("id") if type(doc) is dict else None
    if not _is_id(job_id):
        return None
    model = doc.get("model")
    return job_id, model if isinstance(model, str) else ""


@dataclass(slots=True)
class JobGroup:
    """Jobs of one structure (model, version, outputs, input names, datatypes and shapes), stacked.

    ``inputs`` holds every job's rows along axis 0; job ``j`` owns ``rows`` rows, in order.
    """

    model: str
    version: str | None
    outputs: tuple[str, ...] | None
    indexes: list[int]
    ids: list[str]
    inputs: dict[str, np.ndarray[Any, Any]]
    rows: list[int]

    def select(self, keep: Sequence[int]) -> JobGroup:
        """The group of only the jobs at positions ``keep``."""
        return JobGroup(
            self.model,
            self.version,
            self.outputs,
            [self.indexes[n] for n in keep],
            [self.ids[n] for n in keep],
            take_rows(self.inputs, self.rows, keep),
            [self.rows[n] for n in keep],
        )

    @classmethod
    def concatenate(cls, parts: Sequence[JobGroup]) -> JobGroup:
        """Groups of one signature as one, in order."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        return cls(
            first.model,
            first.version,
            first.outputs,
            [i for part in parts for i in part.indexes],
            [job_id for part in parts for job_id in part.ids],
            {name: np.concatenate([part.inputs[name] for part in parts]) for name in first.inputs},
            [rows for part in parts for rows in part.rows],
        )

    def split(self) -> list[Job]:
        """The group's jobs, each with its own rows (views, not copies)."""
        return [
            Job(job_id, self.model, self.version, inputs, self.outputs)
            for job_id, inputs in zip(self.ids, slice_rows(self.inputs, self.rows), strict=True)
        ]


# Jobs read and stacked at a time: a chunk's objects are freed before the next one's are made, so the allocator
# hands out memory still in cache, and a batch read in chunks takes less time than one read all at once
# (docs/design/jobs.md).
CHUNK = 128

# A job as the fast path reads it: its header (all but its id and its tensors' contents: what its signature is
# made of), its id, and its tensors' contents (each tensor's numbers in a buffer, or the job's binary_data text).
_Read = tuple[tuple[Any, ...], str, Any]


def parse_jobs(
    bodies: Sequence[str | bytes], load_payload: PayloadLoader | None = None
) -> tuple[list[JobGroup], dict[int, Job | FnserveError]]:
    """Parse many message bodies at once.

    Jobs with inline tensors that share one structure are stacked with one numpy call per input and
    chunk (the fast path: no per-job arrays, no per-job validation). Everything else, and every job of
    a chunk's group whose stacking failed, is parsed alone by :func:`parse_job`, so each error names
    its own job. Returns the groups and, by body index, the rest.
    """
    singles: dict[int, Job | FnserveError] = {}
    stacked: dict[tuple[Any, ...], list[JobGroup]] = {}
    parser = simdjson.Parser()  # one a call: a parser is not for two threads at once
    signatures: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}  # by header: a batch's jobs share a few
    for start in range(0, len(bodies), CHUNK):
        similar: dict[tuple[Any, ...], list[tuple[int, _Read]]] = {}
        last: tuple[Any, ...] | None = None  # the last job's header, and its members: a batch's jobs share one
        last_members: list[tuple[int, _Read]] = []
        for i in range(start, min(start + CHUNK, len(bodies))):
            body = bodies[i]
            binary = '"binary_data"' in body if isinstance(body, str) else b'"binary_data"' in body
            read = _read_binary(body) if binary else _read_numbers(parser, body)
            if read is None:
                singles[i] = _parse_alone(body, load_payload)
            elif read[0] == last:  # compared, not hashed
                last_members.append((i, read))
            else:
                last, last_members = read[0], similar.setdefault(read[0], [])
                last_members.append((i, read))
        for header, members in similar.items():
            if header not in signatures:
                signatures[header] = _signature(header)
            signature = signatures[header]
            if signature is None:  # not for the fast path: parsed alone, for an exact error or a job of its own
                for i, _ in members:
                    singles[i] = _parse_alone(bodies[i], load_payload)
                continue
            group = _group(signature, members, bodies, singles, load_payload)
            if group is not None:
                stacked.setdefault(signature, []).append(group)
    return [JobGroup.concatenate(parts) for parts in stacked.values()], singles


def _read_numbers(parser: simdjson.Parser, body: str | bytes) -> _Read | None:
    """A job with its tensors' data in JSON numbers, read by simdjson: its tensors by the codec's
    :func:`~fnserve.core.codec.tensors.read_inputs` (each one's numbers into a buffer, with no Python number made
    for each), and only the few other fields a signature needs made Python objects. None where the fast path
    cannot tell (not JSON, not an object, a field of another type than it takes, nested data): :func:`parse_job`
    then reads the job or says what is wrong with it.

    The header's values are of exact types (shapes and outputs are their JSON text: ``1.0 == 1`` in Python), so
    that a job has the signature of every job whose header equals its own. Nothing read from the parser's
    document outlives this call (the parser reads the next body into the same memory)."""
    try:
        doc: Any = parser.parse(body)
        if type(doc) is not SIMDJSON_OBJECT:
            return None
        job_id, model, inputs = doc["id"], doc["model"], doc["inputs"]
        if len(doc) == 3:  # three keys, and these three found: exactly these
            plain, version, outputs = True, None, None
        else:
            keys = keys_once(doc)  # a key twice: parse_job decides
            plain = "payload" not in keys and "parameters" not in keys
            version = doc["version"] if "version" in keys else None  # tested first: a lookup that misses raises
            outputs = doc["outputs"].mini if "outputs" in keys else None  # not a list: AttributeError
        if type(inputs) is not SIMDJSON_ARRAY or not _strings(job_id, model, version):
            return None
        read = read_inputs(body, inputs, 0 if outputs is None else 1)  # the one list outside its inputs: outputs
        if read is None:  # a tensor of another form, or nested (parsed alone: a ragged list's error)
            return None
        heads, contents = read
        header = (plain, model, version, outputs, False, tuple(heads))
    except Exception:  # noqa: BLE001 - whatever the fast path cannot read, parse_job reads or refuses
        return None
    return header, job_id, contents


def _read_binary(body: str | bytes) -> _Read | None:
    """A job with its tensors in ``binary_data``, read by orjson (it has few values, which orjson makes faster
    than simdjson's proxies are read); its tensors, which hold no numbers, are all in its header as JSON text."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None
    job_id, model, version, binary = doc.get("id"), doc.get("model"), doc.get("version"), doc.get("binary_data")
    if type(binary) is not str or not _strings(job_id, model, version):
        return None
    outputs = doc.get("outputs")
    if outputs is not None:
        outputs = orjson.dumps(outputs)
    plain = "payload" not in doc and "parameters" not in doc
    return (plain, model, version, outputs, True, orjson.dumps(doc.get("inputs"))), job_id, binary


def _strings(job_id: Any, model: Any, version: Any) -> TypeGuard[str]:
    """Whether a job's id and model are strings, and its version one or absent (what the fast path takes; the
    guard: its id)."""
    return type(job_id) is str and type(model) is str and (version is None or type(version) is str)


def _group(
    signature: tuple[Any, ...],
    members: list[tuple[int, _Read]],
    bodies: Sequence[str | bytes],
    singles: dict[int, Job | FnserveError],
    load_payload: PayloadLoader | None,
) -> JobGroup | None:
    """Jobs of one signature stacked; those that cannot be, parsed alone into ``singles`` (None: all of them)."""
    ids = [read[1] for _, read in members]
    if not _all_ids(ids):  # a job whose id is not one is parsed alone, for its error
        valid = [_is_id(job_id) for job_id in ids]
        for (i, _), ok in zip(members, valid, strict=True):
            if not ok:
                singles[i] = _parse_alone(bodies[i], load_payload)
        members = [member for member, ok in zip(members, valid, strict=True) if ok]
        ids = [job_id for job_id, ok in zip(ids, valid, strict=True) if ok]
        if not members:
            return None
    try:
        return _stack(signature, members, ids)
    except Exception:  # parsed one by one instead, so each error names its own job
        for i, _ in members:
            singles[i] = _parse_alone(bodies[i], load_payload)
        return None


def _parse_alone(body: str | bytes, load_payload: PayloadLoader | None) -> Job | FnserveError:
    try:
        return parse_job(body, load_payload)
    except FnserveError as exc:
        return exc
    except Exception as exc:  # a bug of ours: this job's failure (retried, then stored as failed), not the batch's
        logger.exception("job could not be parsed")
        return InferenceError(f"job could not be parsed: {type(exc).__name__}: {exc}")


def _is_id(job_id: Any) -> TypeGuard[str]:
    return type(job_id) is str and JOB_ID.fullmatch(job_id) is not None


def _all_ids(ids: list[Any]) -> bool:
    """Whether every one is a job id, in one regular-expression call for them all rather than one each."""
    try:
        text = "\n".join(ids)
    except TypeError:  # one is not a string
        return False
    return text.count("\n") == len(ids) - 1 and _JOB_IDS.fullmatch(text) is not None


# The keys of a binary tensor on the fast path: name, datatype, shape and parameters.
_BINARY_TENSOR_KEYS = 4


def _signature(header: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The structure of the jobs of one header, or None where the fast path does not take them (parse_job
    then parses each alone; their ids aside: a group's are checked at once, :func:`_all_ids`)."""
    plain, model, version, outputs, binary, tensors = header
    if not plain or not model:  # a payload or a request's parameters; or what parse_job refuses
        return None
    if outputs is not None:
        outputs = orjson.loads(outputs)
        if type(outputs) is not list or any(type(o) is not dict or "parameters" in o for o in outputs):
            return None
        outputs = tuple(o.get("name") for o in outputs)
        if not all(type(n) is str for n in outputs):
            return None
    if binary:  # the tensors as JSON text
        tensors = orjson.loads(tensors)
        if type(tensors) is not list or not all(type(t) is dict and len(t) == _BINARY_TENSOR_KEYS for t in tensors):
            return None  # another key: parsed alone, for an exact error
        tensors = [(t.get("name"), t.get("datatype"), t.get("shape"), t.get("parameters")) for t in tensors]
    else:
        tensors = [(name, datatype, orjson.loads(shape), count) for name, datatype, shape, count in tensors]
    if not tensors:
        return None
    structure = []
    for name, datatype, shape, detail in tensors:
        if type(name) is not str or type(datatype) is not str or type(shape) is not list:
            return None
        if not all(type(d) is int and d > 0 for d in shape):
            return None
        dtype = V2_TO_NUMPY.get(datatype)
        if dtype is None or datatype == "BYTES":
            return None
        if binary:
            size = detail.get("binary_data_size") if type(detail) is dict and len(detail) == 1 else None
            if type(size) is not int or size != math.prod(shape) * dtype.itemsize:
                return None
        else:
            if detail != math.prod(shape):  # as many numbers as the shape holds, in a flat list
                return None
            size = None
        structure.append((name, datatype, tuple(shape), size))
    return (model, version, outputs, tuple(structure), binary)


def _stack(signature: tuple[Any, ...], members: list[tuple[int, _Read]], ids: list[str]) -> JobGroup:
    model, version, outputs, tensors, binary = signature
    inputs = {}
    columns = _binary_columns(tensors, members) if binary else None
    offset = 0
    for k, (name, datatype, shape, size) in enumerate(tensors):
        dtype = V2_TO_NUMPY[datatype]
        if columns is None:
            array = numbers_column(name, datatype, dtype, [read[2][k] for _, read in members])
        else:
            part = columns if len(tensors) == 1 else np.ascontiguousarray(columns[:, offset : offset + size])
            array = part.view(dtype.newbyteorder("<"))  # the extension's byte order, as decode_document reads it
            offset += size
        inputs[name] = array.reshape(len(members) * shape[0], *shape[1:])
    if len(inputs) != len(tensors):  # a name twice
        raise InvalidInput("not stackable")
    rows = tensors[0][2][0]
    return JobGroup(
        model,
        version,
        outputs,
        [i for i, _ in members],
        ids,
        inputs,
        [rows] * len(members),
    )


def _binary_data(value: Any) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str):
        raise InvalidInput("'binary_data' must be a base64 string")
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except ValueError as exc:  # binascii.Error, or a str that is not ASCII
        raise InvalidInput(f"'binary_data' is not valid base64: {exc}") from None


def _binary_columns(tensors: tuple[Any, ...], members: list[tuple[int, _Read]]) -> np.ndarray[Any, Any]:
    """Every job's ``binary_data`` decoded, one row of bytes a job (an error: the group is parsed job by job)."""
    width = sum(size for *_, size in tensors)
    raw = [_binary_data(read[2]) for _, read in members]
    if any(len(chunk) != width for chunk in raw):
        raise InvalidInput("not stackable")
    return np.frombuffer(b"".join(raw), dtype=np.uint8).reshape(len(members), width)


def _referenced(job_id: str, payload: Any, load_payload: PayloadLoader | None) -> tuple[bytes, int | None]:
    if not isinstance(payload, dict) or not isinstance(payload.get("uri"), str):
        raise InvalidInput("'payload' must be an object with a 'uri'")
    json_length = payload.get("json_length")
    if json_length is not None and type(json_length) is not int:
        raise InvalidInput("'payload.json_length' must be an integer")
    if load_payload is None:
        raise InvalidInput("inputs by reference are not available here")
    return load_payload(payload["uri"]), json_length


def job_message(
    job_id: str,
    model: str,
    inputs: dict[str, np.ndarray[Any, Any]],
    *,
    version: str | None = None,
    outputs: list[str] | None = None,
    binary: bool = False,
) -> dict[str, Any]:
    """The message body of a job with its inputs inline: V2 JSON tensors, or ``binary`` (base64 ``binary_data``)."""
    tensors = []
    blobs = []
    for name, array in inputs.items():
        datatype = v2_datatype(array.dtype)
        tensor: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if binary:
            blob = binary_tensor(array, datatype)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]
        tensors.append(tensor)
    message: dict[str, Any] = {"id": job_id, "model": model, "inputs": tensors}
    if binary:
        message["binary_data"] = base64.b64encode(b"".join(blobs)).decode("ascii")
    if version is not None:
        message["version"] = version
    if outputs:
        message["outputs"] = [{"name": n} for n in outputs]
    return message


@dataclass
class SubmitReport:
    """What a send of jobs to a queue or topic did: the ids sent, how many by reference, the ids refused and why."""

    ids: list[str] = field(default_factory=list)
    by_reference: int = 0
    failed: dict[str, str] = field(default_factory=dict)
