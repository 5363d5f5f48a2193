"""Names that travel in URLs and file paths: models, versions, cascades."""

from __future__ import annotations

import re

# Names travel in URLs (/v2/models/{name}/versions/{version}) and in file paths: no slashes,
# no dot-dot, no whitespace, nothing that needs escaping.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,126}[A-Za-z0-9_-])?$")


def check_name(value: str, what: str) -> str:
    """Refuse names that could escape a path or break a URL."""
    if not NAME_PATTERN.match(value) or ".." in value:
        raise ValueError(
            f"{what} {value!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, with no '..'"
        )
    return value
