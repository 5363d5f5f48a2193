"""Client side of batch jobs: enqueue inputs as jobs (SQS SendMessageBatch, or a Pub/Sub topic), read their
results back (DynamoDB, or Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fnserve.core.codec.datafiles import LABEL_KEYS
from fnserve.core.errors import InvalidInput
from fnserve.core.jobs.messages import SubmitReport, job_message
from fnserve.core.jobs.results import ResultStore, job_key
from fnserve.stores import sqs


def jobs_from_file(
    path: Path,
    model: str,
    *,
    input_name: str | None,
    rows_per_job: int,
    version: str | None,
    prefix: str,
    binary: bool = True,
) -> Iterator[dict[str, Any]]:
    """Job messages from .npy / .npz (split by rows; tensors in binary unless not ``binary``), .txt (one text a
    line), or .jsonl: one V2 request a line, as written, or one text a line (a JSON string, or ``{"text": ...}``).
    Texts go ``rows_per_job`` to a job, as the BYTES input ``input_name`` (default ``text``); .npy's array as
    ``input_name`` (default ``input``)."""
    if path.suffix == ".txt":
        texts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        yield from _chunked({input_name or "text": _strings(texts)}, path, model, rows_per_job, version, prefix, binary)
        return
    if path.suffix == ".jsonl":
        requests, texts = _jsonl(path)
        if texts:
            arrays = {input_name or "text": _strings(texts)}
            yield from _chunked(arrays, path, model, rows_per_job, version, prefix, binary)
            return
        for n, doc in requests:
            doc.setdefault("id", f"{prefix}-{n:06d}")
            doc["model"] = model
            if version is not None:
                doc["version"] = version
            yield doc
        return
    if path.suffix == ".npy":
        arrays = {input_name or "input": np.load(path, allow_pickle=False)}
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files if k not in LABEL_KEYS}
    else:
        raise InvalidInput(f"{path}: expected .npy, .npz, .jsonl or .txt")
    yield from _chunked(arrays, path, model, rows_per_job, version, prefix, binary)


def _chunked(
    arrays: dict[str, np.ndarray[Any, Any]],
    path: Path,
    model: str,
    rows_per_job: int,
    version: str | None,
    prefix: str,
    binary: bool,
) -> Iterator[dict[str, Any]]:
    """A job of every ``rows_per_job`` rows of ``arrays``."""
    rows = {a.shape[0] for a in arrays.values()}
    if len(rows) != 1:
        raise InvalidInput(f"{path}: arrays disagree on the number of rows")
    total = rows.pop()
    if not total:
        raise InvalidInput(f"{path}: no rows (no texts) to submit")
    for n, start in enumerate(range(0, total, rows_per_job)):
        chunk = {k: v[start : start + rows_per_job] for k, v in arrays.items()}
        yield job_message(f"{prefix}-{n:06d}", model, chunk, version=version, binary=binary)


def _jsonl(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """A .jsonl file's V2 requests (with their line's index) or its texts: one kind a file."""
    requests: list[tuple[int, dict[str, Any]]] = []
    texts: list[str] = []
    with path.open("rb") as lines:
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"{path}:{n + 1}: not JSON ({exc})") from None
            if isinstance(doc, dict) and isinstance(doc.get("text"), str) and "inputs" not in doc:
                doc = doc["text"]
            if isinstance(doc, str):
                texts.append(doc)
            elif isinstance(doc, dict):
                requests.append((n, doc))
            else:
                raise InvalidInput(f'{path}:{n + 1}: each line must be a V2 request, a text, or {{"text": ...}}')
            if texts and requests:
                raise InvalidInput(f"{path}:{n + 1}: a file holds V2 requests or texts, not both")
    return requests, texts


def _strings(texts: Sequence[str]) -> np.ndarray[Any, Any]:
    array = np.empty(len(texts), dtype=object)
    array[:] = [text.encode() for text in texts]
    return array


def submit(
    queue_url: str,
    jobs: Iterator[dict[str, Any]],
    *,
    bucket: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SubmitReport:
    """Send jobs to an SQS queue, 10 per SendMessageBatch; bodies over SQS's limit go to S3 by reference."""
    return sqs.submit(queue_url, jobs, SubmitReport(), bucket=bucket, progress=progress)


def publish(
    topic: str,
    jobs: Iterator[dict[str, Any]],
    *,
    bucket: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SubmitReport:
    """Publish jobs to a Pub/Sub topic (``projects/P/topics/T``); bodies over its limit go to the bucket."""
    from fnserve.stores import pubsub

    return pubsub.submit(topic, jobs, SubmitReport(), bucket=bucket, progress=progress)


@dataclass
class Results:
    done: dict[str, dict[str, np.ndarray[Any, Any]]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)


def open_store(where: str) -> ResultStore:
    """The result store ``where`` names: a Redis URL (redis:// or rediss://), else a DynamoDB table."""
    if where.startswith(("redis://", "rediss://", "unix://")):
        from fnserve.stores import objects
        from fnserve.stores.redis import RedisResultStore

        return RedisResultStore.from_url(where, payload_source=objects.get_bytes)
    from fnserve.stores.dynamodb import DynamoResultStore

    return DynamoResultStore(where, named=True)  # a person at a shell: errors say which table


def fetch_results(where: str | ResultStore, ids: Sequence[str]) -> Results:
    """Every job's state: done (with outputs), failed (with the reason), or pending.

    ``where``: the store, or what names it (:func:`open_store`).
    """
    store = open_store(where) if isinstance(where, str) else where
    records = store.get(job_key(i) for i in ids)
    results = Results()
    for job_id in ids:
        record = records.get(job_key(job_id))
        if record is None:
            results.pending.append(job_id)
        elif record.status == "done":
            results.done[job_id] = record.outputs()
        else:
            results.failed[job_id] = record.error or "failed"
    return results


def _text(value: Any) -> str:
    """A BYTES element in JSON: its text, as V2's JSON form has it (bytes that are not UTF-8 escaped)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def jsonl_lines(results: Results, ids: Sequence[str]) -> Iterator[str]:
    """One JSON line per job, in ``ids``' order: its id, status, and outputs or error."""
    for job_id in ids:
        line: dict[str, Any] = {"id": job_id}
        if job_id in results.done:
            line["status"] = "done"
            line["outputs"] = {k: v.tolist() for k, v in results.done[job_id].items()}
        elif job_id in results.failed:
            line |= {"status": "failed", "error": results.failed[job_id]}
        else:
            line["status"] = "pending"
        yield orjson.dumps(line, default=_text, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def write_results(results: Results, ids: Sequence[str], path: Path) -> None:
    """.jsonl: one line per job with its state; .npz: each output stacked over the done jobs, plus ``ids``;
    .npy: the one output, stacked over the done jobs."""
    if path.suffix == ".jsonl":
        partial = path.with_name(f".{path.name}.partial")  # a failure leaves no half-written file under the name
        with partial.open("w") as out:
            for line in jsonl_lines(results, ids):
                out.write(line + "\n")
        partial.replace(path)
        return
    if path.suffix not in (".npz", ".npy"):
        raise InvalidInput(f"{path}: expected .npy, .npz or .jsonl")
    done_ids = [i for i in ids if i in results.done]
    names = list(results.done[done_ids[0]]) if done_ids else []
    arrays: dict[str, Any] = {name: np.concatenate([results.done[i][name] for i in done_ids]) for name in names}
    if path.suffix == ".npy":
        if len(arrays) != 1:
            raise InvalidInput(f"{path}: the results have outputs {names}; a .npy holds one, use .npz or .jsonl")
        np.save(path, next(iter(arrays.values())))
        return
    arrays["ids"] = np.array(done_ids)
    np.savez(path, **arrays)


def new_prefix() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"
