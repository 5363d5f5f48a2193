"""S3: models fetched once per process, and payloads too big for SQS messages or DynamoDB items."""

from __future__ import annotations

from pathlib import Path

from fnserve.aws.clients import client
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
    """An object's bytes; a missing object or bucket is a 422 naming it."""
    bucket, key = split_uri(uri)
    s3 = client("s3")
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]
    except s3.exceptions.NoSuchKey:
        raise InvalidInput(f"{uri} does not exist") from None
    except s3.exceptions.NoSuchBucket:
        raise InvalidInput(f"bucket of {uri} does not exist") from None


def put_bytes(bucket: str, key: str, data: bytes) -> str:
    """Store ``data``; returns its s3:// URI."""
    client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"
