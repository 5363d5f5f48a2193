"""fnserve's structured logger (Powertools): JSON lines carrying the request id in adapters."""

from __future__ import annotations

import orjson
from aws_lambda_powertools import Logger


def _dumps(record: object) -> str:
    return orjson.dumps(record, default=str).decode()


# orjson instead of the stdlib encoder: the access log line is on every request's path.
logger = Logger(service="fnserve", json_serializer=_dumps)
