"""fnserve's structured logger (Powertools): JSON lines carrying the request id in adapters."""

from __future__ import annotations

from aws_lambda_powertools import Logger

logger = Logger(service="fnserve")
