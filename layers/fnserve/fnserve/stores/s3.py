"""S3: models fetched once per process, and payloads too big for SQS messages or DynamoDB items."""

from __future__ import annotations

from pathlib import Path

from fnserve.aws.clients import client, store_error
from fnserve.stores._uri import split_uri


def fetch_model(uri: str, target: Path) -> Path:
    """The registry's fetcher for ``s3://`` model files, data files too (the registry verifies their sha256)."""
    bucket, key = split_uri(uri, "s3")
    partial = target.with_name(f"{target.name}.partial")  # with_suffix would give model.onnx_data the same one
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
    bucket, key = split_uri(uri, "s3")
    try:
        return client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]
    except Exception as exc:
        raise store_error(exc, f"{uri} cannot be read") from exc


def put_bytes(bucket: str, key: str, data: bytes) -> str:
    """Store ``data``; returns its s3:// URI."""
    client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def upload_file(path: Path, uri: str, sha256: str) -> None:
    """Upload ``path`` as ``uri`` (multipart when big), its sha256 in the object's metadata."""
    from boto3.exceptions import S3UploadFailedError

    bucket, key = split_uri(uri, "s3")
    try:
        client("s3").upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": sha256}})
    except Exception as exc:
        # boto3's transfer wraps S3's answer in S3UploadFailedError: the ClientError it caught says what S3 said.
        said = exc.__context__ if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None else exc
        raise store_error(said, f"{uri} cannot be written", writing=True) from exc


def stored_sha256(uri: str) -> str | None:
    """The sha256 :func:`upload_file` recorded for ``uri``, or None when the object is not known to be there:
    missing, or hidden by a 403 (without s3:ListBucket, S3 answers a missing key so)."""
    bucket, key = split_uri(uri, "s3")
    try:
        head = client("s3").head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code")
        # Safe: push then uploads, which is its aim (skipping only saves time); without s3:PutObject that fails.
        if code in ("404", "NoSuchKey", "NotFound", "403", "AccessDenied", "Forbidden"):
            return None
        raise
    return head.get("Metadata", {}).get("sha256")  # type: ignore[no-any-return]
