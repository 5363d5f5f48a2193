"""Objects by URI, whichever cloud holds them: ``s3://`` (S3) or ``gs://`` (Cloud Storage).

Models, an s3:// or gs:// manifest, job inputs sent by reference and results too big for
their store all go through here, so every path of fnserve reads either cloud's objects.
A bucket setting (FNSERVE_RESULTS_BUCKET) is a bare name (S3, as before) or ``gs://name``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from fnserve.core.errors import ConfigError, InvalidInput

SCHEMES = ("s3", "gs")


def get_bytes(uri: str) -> bytes:
    """An object's bytes (a 422 for a bad or missing reference, a 503 for an outage)."""
    data: bytes = _backend(uri).get_bytes(uri)
    return data


def put_bytes(bucket: str, key: str, data: bytes) -> str:
    """Store ``data`` as ``key`` in ``bucket`` (``gs://name`` for Cloud Storage, else S3); returns its URI."""
    if bucket.startswith("gs://"):
        from fnserve.stores import gcs

        return gcs.put_bytes(bucket[5:].rstrip("/"), key, data)
    from fnserve.stores import s3

    return s3.put_bytes(bucket.removeprefix("s3://").rstrip("/"), key, data)


def fetch_model(uri: str, target: Path) -> Path:
    """The model registry's fetcher for both schemes."""
    fetched: Path = _backend(uri).fetch_model(uri, target)
    return fetched


def upload_file(path: Path, uri: str, sha256: str) -> None:
    """Upload a file (in parts when it is big) as ``uri``, its sha256 kept in the object's metadata."""
    _backend(uri).upload_file(path, uri, sha256)


def stored_sha256(uri: str) -> str | None:
    """The sha256 :func:`upload_file` recorded for ``uri``; None when there is no such object (or it has none)."""
    digest: str | None = _backend(uri).stored_sha256(uri)
    return digest


def _backend(uri: str) -> Any:
    """The module serving ``uri``'s scheme (imported on first use: each pulls in its cloud's client)."""
    if uri.startswith("gs://"):
        from fnserve.stores import gcs

        return gcs
    if uri.startswith("s3://"):
        from fnserve.stores import s3

        return s3
    raise InvalidInput(f"{uri!r} is not an s3:// or gs:// URI")


def job_body(job: dict[str, Any], bucket: str | None, limit: int) -> tuple[str, bool]:
    """The message body of ``job`` for a queue or topic taking at most ``limit`` bytes, and whether its
    inputs went to ``bucket`` by reference (see :mod:`fnserve.core.jobs.messages`)."""
    body = orjson.dumps(job)
    if len(body) <= limit - 1024:  # room for the message's attributes
        return body.decode(), False
    if bucket is None:
        # The deployment's fault, not the job's: it has no bucket for inputs sent by reference.
        raise ConfigError(
            f"job {job['id']} is {len(body)} bytes, over the message size limit ({limit}), and no bucket is "
            "set for it (FNSERVE_RESULTS_BUCKET, or --bucket)"
        )
    request = {k: v for k, v in job.items() if k not in ("id", "model", "version")}
    uri = put_bytes(bucket, f"fnserve/jobs/{job['id']}.json", orjson.dumps(request))
    ref = {k: job[k] for k in ("id", "model", "version") if k in job} | {"payload": {"uri": uri}}
    return orjson.dumps(ref).decode(), True
