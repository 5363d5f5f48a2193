"""A text stream that hands on each complete line: what a worker's stdout, the emulator console and a
readable server log are built on."""

from __future__ import annotations

import io
from collections.abc import Callable


class LineWriter(io.TextIOBase):
    """A writable text stream that hands each complete line to ``emit``."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self.write("\n")
