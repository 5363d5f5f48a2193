"""Object URIs: ``scheme://bucket/key`` (the one rule both object stores parse by)."""

from __future__ import annotations

from fnserve.core.errors import InvalidInput


def split_uri(uri: str, scheme: str) -> tuple[str, str]:
    """``scheme://bucket/key`` -> (bucket, key), or a 422 naming the bad URI."""
    prefix = f"{scheme}://"
    bucket, _, key = uri.removeprefix(prefix).partition("/")
    if not uri.startswith(prefix) or not bucket or not key:
        raise InvalidInput(f"{uri!r} must be {prefix}bucket/key")
    return bucket, key
