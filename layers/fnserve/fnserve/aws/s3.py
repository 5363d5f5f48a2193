"""S3: models fetched once per process, and payloads too big for SQS messages or DynamoDB items."""

from __future__ import annotations

from pathlib import Path

from fnserve.aws.clients import client, store_error
from fnserve.core.errors import InvalidInput


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key), or a 422 naming the bad URI."""
    if not uri.startswith("s3://"):
        raise InvalidInput(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket or not key:
        raise InvalidInput(f"{uri!r} must be s3://bucket/key")
    return bucket, key


def fetch_model(uri: str, target: Path) -> Path:
    """The registry's fetcher for ``s3://`` model paths (the registry verifies the sha256)."""
    bucket, key = split_uri(uri)
    partial = target.with_suffix(".partial")
    client("s3").download_file(bucket, key, str(partial))
    partial.replace(target)  # never leave a half-written model where a later load would find it
    return target


def get_bytes(uri: str) -> bytes:
    """An object's bytes.

    What is wrong with the reference itself (an invalid bucket name, a missing object or
    bucket, an object this function may not read) is a 422 naming it; a timeout, throttling
    or an unreachable S3 is a :class:`~fnserve.core.errors.StoreUnavailable` (503), which may heal.
    (Without s3:ListBucket, S3 answers a missing object with AccessDenied, not NoSuchKey.)
    """
    bucket, key = split_uri(uri)
    try:
        return client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]
    except Exception as exc:
        raise store_error(exc, f"{uri} cannot be read") from exc


def put_bytes(bucket: str, key: str, data: bytes) -> str:
    """Store ``data``; returns its s3:// URI."""
    client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"
