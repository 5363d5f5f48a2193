"""Every boto3 client fnserve uses comes from here: one per service and budget per process, made lazily.

Endpoints and retries follow botocore's own configuration chain: ``AWS_ENDPOINT_URL_<SERVICE>``
(``AWS_ENDPOINT_URL_DYNAMODB``: DynamoDB Local beside LocalStack, say), then ``AWS_ENDPOINT_URL``,
then the config file; ``AWS_RETRY_MODE`` and ``AWS_MAX_ATTEMPTS``. fnserve adds LocalStack's
endpoints (localstack-client's conventions) when ``LOCALSTACK_HOST`` is set and nothing else
names one. Against a local emulator, a machine with no AWS configuration still works: the
region and credentials default to the emulator's (any value does), where nothing else provides them.

A :class:`Budget` bounds what one call may cost (timeouts and attempts): the result cache's
reads must stay within milliseconds even when DynamoDB stalls, a batch's writes may take longer.
The default budget's attempts and retry mode give way to ``AWS_MAX_ATTEMPTS`` and ``AWS_RETRY_MODE``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from fnserve.core.errors import ConfigError, FnserveError, InvalidInput, StoreUnavailable

logger = logging.getLogger(__name__)
_lock = threading.Lock()
LOCAL_REGION = "us-east-1"

# Error codes that say "not now" rather than "never": throttling, expired or clock-skewed
# credentials, the service's own faults. Anything else from a 4xx is about the request itself.
TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "LimitExceededException",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "TransactionInProgressException",
        "InternalError",
        "InternalServerError",
        "ServiceUnavailable",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "RequestTimeTooSkewed",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404", "ResourceNotFoundException"})
DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "403", "Forbidden"})


@dataclass(frozen=True)
class Budget:
    """What one call may cost: connect and read timeouts (seconds) and attempts (standard retry mode)."""

    connect_timeout: float = 2.0
    read_timeout: float = 10.0
    max_attempts: int = 4


DEFAULT_BUDGET = Budget()


def endpoint_url(service: str) -> str | None:
    """The endpoint fnserve's clients use for ``service``, or None for AWS itself."""
    url = _environment_endpoint(service)
    if url:
        return url
    if os.environ.get("LOCALSTACK_HOST"):
        from localstack_client.config import get_service_endpoint

        return get_service_endpoint(service)  # type: ignore[no-any-return]
    return None


def _environment_endpoint(service: str) -> str | None:
    """The endpoint botocore itself reads for ``service`` from the environment (per service first)."""
    for name in (f"AWS_ENDPOINT_URL_{service.upper().replace('-', '_')}", "AWS_ENDPOINT_URL"):
        url = os.environ.get(name, "").strip()
        if url:
            return url
    return None


def is_local(url: str | None) -> bool:
    """Whether ``url`` is an emulator on this machine (or LocalStack), where any region and keys do."""
    if url is None:
        return False
    host = urlparse(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.") or bool(os.environ.get("LOCALSTACK_HOST"))


def client(service: str, budget: Budget = DEFAULT_BUDGET) -> Any:
    """The process's client for ``service`` within ``budget`` (created on first use; boto3 imported only then)."""
    return _client(service, budget)  # positional: one cache entry however the caller spells it


@functools.cache
def _client(service: str, budget: Budget) -> Any:
    with _lock:  # boto3's default session is not thread-safe while it creates clients
        import boto3
        from botocore.config import Config

        retries: dict[str, Any] = {"mode": "standard", "total_max_attempts": budget.max_attempts}
        if budget == DEFAULT_BUDGET:  # the environment's choices, where it makes them
            if os.environ.get("AWS_RETRY_MODE"):
                del retries["mode"]
            if os.environ.get("AWS_MAX_ATTEMPTS"):
                del retries["total_max_attempts"]
        config = Config(
            retries=retries or None,
            connect_timeout=budget.connect_timeout,
            read_timeout=budget.read_timeout,
            max_pool_connections=32,
        )
        endpoint = endpoint_url(service)
        session = boto3.session.Session()
        options: dict[str, Any] = {}
        if endpoint is not None and _environment_endpoint(service) is None:
            options["endpoint_url"] = endpoint  # LocalStack's; botocore reads the environment's itself
        if is_local(endpoint):
            if session.region_name is None:
                options["region_name"] = LOCAL_REGION
            if session.get_credentials() is None:
                options |= {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
        return session.client(service, config=config, **options)


def reset() -> None:
    """Forget every client (after the endpoint changes, or in a restored SnapStart snapshot)."""
    _client.cache_clear()


def store_error(exc: BaseException, what: str, writing: bool = False) -> FnserveError:
    """An AWS call's failure as fnserve's error: the request's own fault (422), or a store that may heal (503);
    ``writing``: the call wrote ``what``, so a denial is about writing it."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        NoRegionError,
        ParamValidationError,
        PartialCredentialsError,
    )

    if isinstance(exc, FnserveError):
        return exc
    if isinstance(exc, NoRegionError):
        return ConfigError(f"{what}: no AWS region is configured; set AWS_DEFAULT_REGION")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return ConfigError(
            f"{what}: no AWS credentials were found; configure them (aws configure, AWS_PROFILE, or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    if isinstance(exc, ParamValidationError):
        return InvalidInput(f"{what}: {exc}")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 500)
        if code in TRANSIENT_CODES or status >= 500:
            return StoreUnavailable(f"{what}: {code or status}, try again later")
        if code in MISSING_CODES:
            return InvalidInput(f"{what}: it does not exist")
        if code in DENIED_CODES and writing:
            return InvalidInput(f"{what}: access denied (the caller may not write it: {error.get('Message', code)})")
        if code in DENIED_CODES:
            return InvalidInput(f"{what}: it does not exist, or this function may not read it (access denied)")
        return InvalidInput(f"{what}: {code}: {error.get('Message', '')}")
    if isinstance(exc, BotoCoreError | OSError):
        logger.info("%s: %s", what, exc)  # the endpoint's address stays in the logs, not in answers
        return StoreUnavailable(f"{what}: {_reason(exc)}, try again later")
    raise exc


def _reason(exc: BaseException) -> str:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError | TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, BotoConnectionError | ConnectionError):
        return "it cannot be reached"
    return type(exc).__name__
