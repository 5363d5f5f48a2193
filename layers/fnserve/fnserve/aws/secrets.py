"""Secrets read at run time from Secrets Manager (Powertools Parameters, cached), never from the environment.

The follow-up id signing key and the API keys live in secrets the template generates; a function holds only a
secret's ARN (``FNSERVE_RESULT_ID_KEY_SECRET``, ``FNSERVE_API_KEYS_SECRET``), so a key shows neither in the
function's configuration nor in its environment, and rotating it needs no stack update: each container reads it
again once its cached copy is ``max_age`` seconds old.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fnserve.aws.clients import client
from fnserve.core.errors import ConfigError

logger = logging.getLogger(__name__)
MAX_AGE_SECONDS = 300


def rotating_keys(
    secret: str, max_age: int = MAX_AGE_SECONDS, what: str = "the follow-up id key"
) -> Callable[[], Sequence[bytes]]:
    """The secret's current value, then its previous one (AWSPREVIOUS, after a rotation), as keys; ``what`` they
    are, for the error that stops a start.

    Read once now: a secret that cannot be read stops the start with the reason. Later reads
    come from Powertools' cache, refreshed every ``max_age`` seconds; a refresh that fails keeps
    the keys it had (a Secrets Manager outage must not fail requests).
    """
    from aws_lambda_powertools.utilities.parameters import SecretsProvider
    from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError

    # Two providers: Powertools caches by name, whatever the version stage asked.
    current, previous = (
        SecretsProvider(boto3_client=client("secretsmanager")),
        SecretsProvider(boto3_client=client("secretsmanager")),
    )
    try:
        known: list[bytes] = [_bytes(current.get(secret, max_age=max_age))]
    except GetParameterError as exc:
        raise ConfigError(f"cannot read {what} from secret {secret}: {exc}") from None

    def keys() -> Sequence[bytes]:
        nonlocal known
        try:
            fresh = [_bytes(current.get(secret, max_age=max_age))]
        except GetParameterError as exc:
            logger.warning("secret %s: %s; keeping the keys read before", secret, exc)
            return known
        try:
            fresh.append(_bytes(previous.get(secret, max_age=max_age, VersionStage="AWSPREVIOUS")))
        except GetParameterError:
            pass  # never rotated: no previous version
        known = fresh
        return known

    return keys


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
