"""Reading the shell blocks of the README and the docs pages."""

from __future__ import annotations

import re


def starts(block: str, command: str) -> bool:
    return re.match(re.escape(command) + r"(\s|$)", block.lstrip()) is not None
