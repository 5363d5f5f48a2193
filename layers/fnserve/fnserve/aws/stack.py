"""A deployed stack's outputs as the shell variables every page of the docs uses.

The variables carry the outputs' own names (``JobsQueueUrl``, ``ResultsTableName``): the names
CloudFormation's console, ``describe-stacks`` and template.yaml show, so a reader meets one name for each.
"""

from __future__ import annotations

import re
import shlex

from fnserve.aws.clients import DENIED_CODES, client
from fnserve.core.errors import ConfigError

_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def outputs(stack_name: str) -> dict[str, str]:
    """The stack's outputs, by key, as ``describe-stacks`` gives them."""
    try:
        described = client("cloudformation").describe_stacks(StackName=stack_name)
    except Exception as exc:
        error = getattr(exc, "response", {}).get("Error", {})
        if error.get("Code") == "ValidationError":  # CloudFormation's answer for a stack that does not exist
            raise ConfigError(f"no stack {stack_name!r} in this account and region: {error.get('Message')}") from exc
        if error.get("Code") in DENIED_CODES:
            raise ConfigError(f"not allowed to describe stack {stack_name!r}: {error.get('Message')}") from exc
        raise
    (stack,) = described["Stacks"]
    return {item["OutputKey"]: item["OutputValue"] for item in stack.get("Outputs", [])}


def exports(found: dict[str, str]) -> str:
    """``export Key=value`` lines a shell's ``eval`` runs, each value quoted."""
    for key in found:
        if not _SHELL_NAME.fullmatch(key):  # CloudFormation's keys are alphanumeric: only a changed API breaks this
            raise ConfigError(f"output {key!r} cannot be a shell variable's name")
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(found.items()))
