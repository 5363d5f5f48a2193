"""Cloud Storage: models fetched once per process (``gs://`` paths in the manifest), and job inputs or
results too big for a message or a Redis value, by reference.

The client honours ``STORAGE_EMULATOR_HOST`` (a local emulator, as the tests use) and
Application Default Credentials (the function's service account on Google Cloud).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from fnserve.core.errors import ConfigError, FnserveError, InvalidInput, StoreUnavailable
from fnserve.stores._uri import split_uri

if TYPE_CHECKING:
    from google.cloud.storage import Client


@functools.cache
def client() -> Client:
    """One client per process (it pools its connections)."""
    from google.cloud import storage

    return storage.Client()


def fetch_model(uri: str, target: Path) -> Path:
    """The registry's fetcher for ``gs://`` model files, data files too (the registry verifies their sha256)."""
    bucket, key = split_uri(uri, "gs")
    partial = target.with_name(f"{target.name}.partial")  # with_suffix would give model.onnx_data the same one
    try:
        client().bucket(bucket).blob(key).download_to_filename(str(partial))
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise storage_error(exc, f"{uri} cannot be read") from exc
    partial.replace(target)  # never leave a half-written model where a later load would find it
    return target


def get_bytes(uri: str) -> bytes:
    """An object's bytes: a missing or forbidden object is a 422 naming it; an outage a 503, which may heal."""
    bucket, key = split_uri(uri, "gs")
    try:
        return client().bucket(bucket).blob(key).download_as_bytes()  # type: ignore[no-any-return]
    except Exception as exc:
        raise storage_error(exc, f"{uri} cannot be read") from exc


def put_bytes(bucket: str, key: str, data: bytes) -> str:
    """Store ``data``; returns its gs:// URI."""
    try:
        client().bucket(bucket).blob(key).upload_from_string(data, content_type="application/octet-stream")
    except Exception as exc:
        raise storage_error(exc, f"gs://{bucket}/{key} cannot be written") from exc
    return f"gs://{bucket}/{key}"


def upload_file(path: Path, uri: str, sha256: str) -> None:
    """Upload ``path`` as ``uri`` (resumable when big), its sha256 in the object's metadata."""
    bucket, key = split_uri(uri, "gs")
    try:
        blob = client().bucket(bucket).blob(key)
        blob.metadata = {"sha256": sha256}
        blob.upload_from_filename(str(path), content_type="application/octet-stream")
    except Exception as exc:
        raise storage_error(exc, f"{uri} cannot be written") from exc


def stored_sha256(uri: str) -> str | None:
    """The sha256 :func:`upload_file` recorded for ``uri``, or None when the object is not known to be there:
    missing, or not readable by a caller that may only create objects (``roles/storage.objectCreator``)."""
    from google.api_core.exceptions import Forbidden

    bucket, key = split_uri(uri, "gs")
    try:
        blob = client().bucket(bucket).get_blob(key)
    except Forbidden:
        return None  # safe: push then uploads, which is its aim; a caller that may not create objects fails there
    except Exception as exc:
        raise storage_error(exc, f"{uri} cannot be read") from exc
    return None if blob is None else (blob.metadata or {}).get("sha256")


def storage_error(exc: BaseException, what: str) -> FnserveError:
    """A Cloud Storage call's failure as fnserve's error: the reference's own fault (422), missing
    credentials (a configuration error), or a service that may heal (503)."""
    from google.api_core import exceptions as api
    from google.auth.exceptions import DefaultCredentialsError

    if isinstance(exc, FnserveError):
        return exc
    if isinstance(exc, DefaultCredentialsError):
        return ConfigError(f"{what}: no Google Cloud credentials were found (Application Default Credentials)")
    if isinstance(exc, api.NotFound):
        return InvalidInput(f"{what}: it does not exist")
    if isinstance(exc, api.Forbidden | api.Unauthorized):
        return InvalidInput(f"{what}: access denied")
    if isinstance(exc, api.BadRequest):
        return InvalidInput(f"{what}: {getattr(exc, 'message', exc)}")
    return StoreUnavailable(f"{what}: {type(exc).__name__}, try again later")
