"""Every boto3 client fnserve uses comes from here: one per service per process, made lazily.

The endpoint is decided once for all services, so a moto server or LocalStack takes all the
traffic or none of it: ``AWS_ENDPOINT_URL`` if set, else LocalStack's (localstack-client's
conventions) when ``LOCALSTACK_HOST`` is set, else AWS itself.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

_lock = threading.Lock()


def endpoint_url(service: str) -> str | None:
    """The endpoint all of fnserve's clients use for ``service``, or None for AWS itself."""
    url = os.environ.get("AWS_ENDPOINT_URL", "").strip()
    if url:
        return url
    if os.environ.get("LOCALSTACK_HOST"):
        from localstack_client.config import get_service_endpoint

        return get_service_endpoint(service)  # type: ignore[no-any-return]
    return None


@functools.cache
def client(service: str) -> Any:
    """The process's client for ``service`` (created on first use; boto3 imported only then)."""
    with _lock:  # boto3's default session is not thread-safe while it creates clients
        import boto3
        from botocore.config import Config

        config = Config(
            retries={"mode": "standard", "max_attempts": 4},
            connect_timeout=2,
            read_timeout=10,
            max_pool_connections=32,
        )
        return boto3.session.Session().client(service, endpoint_url=endpoint_url(service), config=config)


def reset() -> None:
    """Forget every client (after the endpoint changes, or in a restored SnapStart snapshot)."""
    client.cache_clear()
