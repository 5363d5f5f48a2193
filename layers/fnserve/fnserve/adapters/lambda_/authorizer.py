"""The HTTP API's Lambda authorizer for ``ApiAuth=APIKEY``: the ``Authorization: Bearer KEY`` a request brings,
checked against the keys ``FNSERVE_API_KEYS_SECRET`` names (payload format 2.0, simple responses).

API Gateway refuses a request without the header itself (401) and answers 403 where this says no; it keeps the
answer for one header value as long as the authorizer's TTL says. A secret that cannot be read refuses every
caller, never lets one through; the keys read before outlive a later failed refresh.
"""

from __future__ import annotations

from typing import Any

from fnserve.adapters.keys import ApiKeys, api_keys
from fnserve.core.errors import ConfigError
from fnserve.observability.logs import logger
from fnserve.settings import HttpSettings

_keys: ApiKeys | None = None


def held() -> ApiKeys:
    """The keys, read on the first invocation that can (a failed first read is tried again by the next)."""
    global _keys
    if _keys is None:
        keys = api_keys(HttpSettings())
        if keys is None:
            raise ConfigError("the authorizer has no keys to check: set FNSERVE_API_KEYS_SECRET")
        _keys = keys
    return _keys


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """``{"isAuthorized": ...}``, with the key's id in the context the API function sees."""
    header = (event.get("headers") or {}).get("authorization")
    try:
        keys = held()
    except ConfigError as exc:
        logger.error(f"refusing every caller: {exc.message}")
        return {"isAuthorized": False}
    caller = keys.caller(header)
    if caller is None:
        logger.info("refused a key it does not hold", extra={"route": event.get("routeKey")})
        return {"isAuthorized": False}
    return {"isAuthorized": True, "context": {"keyId": caller}}
