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

from fnserve.core._rows import slice_rows, take_rows
from fnserve.core.datatypes import V2_TO_NUMPY, v2_datatype
from fnserve.core.errors import BadRequest, FnserveError, InferenceError, InvalidInput
from fnserve.core.tensors import array_from_json, binary_tensor, decode_document, decode_request, json_object

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


# Jobs parsed and stacked at a time: a chunk's objects are freed before the next one's are made, so the allocator
# hands out memory still in cache. 10,000 digits jobs parse in 0.65 (JSON numbers) and 0.6 (binary) of the time
# all at once take; 128 was the fastest of 64 to 1,024 on each.
CHUNK = 128


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
    for start in range(0, len(bodies), CHUNK):
        for signature, members in _similar(bodies, start, singles, load_payload).items():
            group = _group(signature, members, bodies, singles, load_payload)
            if group is not None:
                stacked.setdefault(signature, []).append(group)
    return [JobGroup.concatenate(parts) for parts in stacked.values()], singles


def _similar(
    bodies: Sequence[str | bytes],
    start: int,
    singles: dict[int, Job | FnserveError],
    load_payload: PayloadLoader | None,
) -> dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]]:
    """The stackable jobs of the chunk from ``start`` by signature; the others parsed alone into ``singles``."""
    similar: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}
    last_header: tuple[Any, ...] | None = None  # the last stackable job's header, and its group's members
    last_members: list[tuple[int, dict[str, Any]]] = []
    for i in range(start, min(start + CHUNK, len(bodies))):
        body = bodies[i]
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            singles[i] = BadRequest(f"job is not valid JSON: {exc}")
            continue
        header = _header(doc)
        if header is not None and header == last_header:
            last_members.append((i, doc))  # a batch of one model's jobs has one header: checked once (ids later)
            continue
        signature = _signature(doc)
        if signature is None:
            singles[i] = _parse_alone(body, load_payload)
            continue
        members = similar.setdefault(signature, [])
        members.append((i, doc))
        if header is not None:
            last_header, last_members = header, members
    return similar


def _group(
    signature: tuple[Any, ...],
    members: list[tuple[int, dict[str, Any]]],
    bodies: Sequence[str | bytes],
    singles: dict[int, Job | FnserveError],
    load_payload: PayloadLoader | None,
) -> JobGroup | None:
    """Jobs of one signature stacked; those that cannot be, parsed alone into ``singles`` (None: all of them)."""
    ids: list[Any] = [doc.get("id") for _, doc in members]
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


def _header(doc: Any) -> tuple[Any, ...] | None:
    """What :func:`_signature` reads of a job but its id and its numbers, compared exactly (``1.0`` is not ``1``): a
    job with the header of one whose signature is known has that signature, once its id is checked. Half the
    signature's cost or less (0.4 against 0.9 us a binary job); None where it cannot tell (the signature decides)."""
    if type(doc) is not dict:
        return None
    binary = doc.get("binary_data")
    try:
        if type(binary) is str:  # the tensors hold no data: all of them, as JSON text
            tensors: Any = orjson.dumps(doc.get("inputs"))
        elif binary is None:  # all but the data, whose type only the signature reads
            tensors = [
                (t["name"], t["datatype"], orjson.dumps(t["shape"]), type(t["data"]), "parameters" in t)
                for t in doc["inputs"]
            ]
        else:
            return None
    except (TypeError, KeyError):  # not a list of tensors with these keys
        return None
    return (
        doc.get("model"),
        doc.get("version"),
        doc.get("outputs"),
        "payload" in doc or "parameters" in doc,
        binary is None,
        tensors,
    )


def _is_id(job_id: Any) -> TypeGuard[str]:
    return type(job_id) is str and JOB_ID.fullmatch(job_id) is not None


def _all_ids(ids: list[Any]) -> bool:
    """Whether every one is a job id, in one call (a tenth of a call each)."""
    try:
        text = "\n".join(ids)
    except TypeError:  # one is not a string
        return False
    return text.count("\n") == len(ids) - 1 and _JOB_IDS.fullmatch(text) is not None


def _signature(doc: Any) -> tuple[Any, ...] | None:
    """The structure of a plain inline job, or None for anything the fast path does not take (its id aside: a
    group's ids are checked at once, :func:`_all_ids`)."""
    if type(doc) is not dict or "payload" in doc or "parameters" in doc:  # a request's parameters: checked alone
        return None
    model, version, inputs = doc.get("model"), doc.get("version"), doc.get("inputs")
    if type(model) is not str or not model or type(inputs) is not list or not inputs:  # as parse_job refuses
        return None
    if version is not None and type(version) is not str:
        return None
    binary = doc.get("binary_data")
    if binary is not None and type(binary) is not str:
        return None
    tensors = []
    for t in inputs:
        if type(t) is not dict:
            return None
        if binary is None:  # JSON numbers
            if "parameters" in t or type(t.get("data")) is not list:
                return None
            size = None
        else:  # the binary extension: the tensor's bytes are in binary_data
            params = t.get("parameters")
            if "data" in t or type(params) is not dict or len(params) != 1:
                return None
            size = params.get("binary_data_size")
            if type(size) is not int:
                return None
        name, datatype, shape = t.get("name"), t.get("datatype"), t.get("shape")
        if type(name) is not str or type(datatype) is not str or type(shape) is not list:
            return None  # parsed alone, for an exact error
        if not all(type(d) is int for d in shape):
            return None
        tensors.append((name, datatype, tuple(shape), size))
    outputs = doc.get("outputs")
    if outputs is not None:
        if type(outputs) is not list or any(type(o) is not dict or "parameters" in o for o in outputs):
            return None
        names = tuple(o.get("name") for o in outputs)
        if not all(type(n) is str for n in names):
            return None
        outputs = names
    return (model, version, outputs, tuple(tensors), binary is not None)


def _stack(signature: tuple[Any, ...], members: list[tuple[int, dict[str, Any]]], ids: list[str]) -> JobGroup:
    model, version, outputs, tensors, binary = signature
    inputs = {}
    columns = _binary_columns(tensors, members) if binary else None
    offset = 0
    for k, (name, datatype, shape, size) in enumerate(tensors):
        dtype = V2_TO_NUMPY.get(datatype)
        if dtype is None or datatype == "BYTES" or not all(d > 0 for d in shape):
            raise InvalidInput("not stackable")  # parsed one by one instead, for exact errors
        if columns is None:
            data = [doc["inputs"][k]["data"] for _, doc in members]
            array = array_from_json(name, datatype, dtype, data)
        else:
            if size != math.prod(shape) * dtype.itemsize:
                raise InvalidInput("not stackable")
            part = columns if len(tensors) == 1 else np.ascontiguousarray(columns[:, offset : offset + size])
            array = part.view(dtype.newbyteorder("<"))  # the extension's byte order, as decode_document reads it
            offset += size
        if array.size != len(members) * math.prod(shape):
            raise InvalidInput("not stackable")
        inputs[name] = array.reshape(len(members) * shape[0], *shape[1:])
    if len(inputs) != len(tensors):
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


def _binary_columns(tensors: tuple[Any, ...], members: list[tuple[int, dict[str, Any]]]) -> np.ndarray[Any, Any]:
    """Every job's ``binary_data`` decoded, one row of bytes a job (an error: the group is parsed job by job)."""
    width = sum(size for *_, size in tensors)
    raw = [_binary_data(doc["binary_data"]) for _, doc in members]
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
