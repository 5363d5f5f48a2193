"""Batch jobs: the message format, parsing, and what a stored result looks like.

A job is a V2 inference request with the model named inside it::

    {"id": "job-42", "model": "digits-accurate", "version": "1",          # version optional
     "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [...]}],
     "outputs": [{"name": "label"}]}                                       # optional

or, when the inputs are over SQS's message limit, a reference to an object holding the
V2 request body (JSON, or JSON then binary tensors with ``json_length`` set)::

    {"id": "job-43", "model": "digits-accurate", "payload": {"uri": "s3://bucket/key", "json_length": 187}}
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from fnserve.core.errors import BadRequest, FnserveError, InvalidInput
from fnserve.core.tensors import decode_document, decode_request

JOB_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
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


def job_key(job_id: str) -> str:
    """The result store key of a job's result."""
    return f"job#{job_id}"


def parse_job(body: str | bytes, load_payload: PayloadLoader | None = None) -> Job:
    """Parse one message body; every problem is a :class:`FnserveError` saying what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"job is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("job must be a JSON object")
    job_id = doc.get("id")
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise InvalidInput("job needs an 'id' of 1-128 letters, digits, '.', '_', ':' or '-'")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput(f"job {job_id}: needs a 'model' string")
    version = doc.get("version")
    if version is not None and not isinstance(version, str):
        raise InvalidInput(f"job {job_id}: 'version' must be a string")
    try:
        payload = doc.get("payload")
        if payload is not None:
            request = decode_request(*_referenced(job_id, payload, load_payload))
        else:
            request = decode_document(doc)
    except FnserveError as exc:
        raise type(exc)(f"job {job_id}: {exc.message}", exc.status_code) from None
    outputs = tuple(request.outputs) if request.outputs is not None else None
    return Job(job_id, model, version, request.inputs, outputs)


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
) -> dict[str, Any]:
    """The message body of a job with its inputs inline, as V2 JSON tensors."""
    from fnserve.core.datatypes import v2_datatype

    tensors = []
    for name, array in inputs.items():
        datatype = v2_datatype(array.dtype)
        data = [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]
        tensors.append({"name": name, "shape": list(array.shape), "datatype": datatype, "data": data})
    message: dict[str, Any] = {"id": job_id, "model": model, "inputs": tensors}
    if version is not None:
        message["version"] = version
    if outputs:
        message["outputs"] = [{"name": n} for n in outputs]
    return message
