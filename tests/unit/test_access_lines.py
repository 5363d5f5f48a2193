"""Access lines of a server process: one write a turn of its event loop (fnserve.observability.logs.AccessLines)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from fnserve.observability import logs


class Writes(io.StringIO):
    """A stream that counts the writes it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def write(self, text: str) -> int:
        self.count += 1
        return super().write(text)


@pytest.fixture
def stream() -> Iterator[Writes]:
    handler = logs.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    level = logs.logger.log_level
    logs.logger.setLevel("INFO")
    writes = Writes()
    previous = handler.setStream(writes)
    try:
        yield writes
    finally:
        handler.setStream(previous)
        logs.logger.setLevel(level)


def _lines(stream: Writes) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_the_lines_of_one_turn_leave_in_one_write_at_its_end_in_order(stream: Writes) -> None:
    held = logs.AccessLines()

    async def serve() -> None:
        await held.start()
        for n in range(3):  # three requests answered in one turn
            logs.access("inference", {"n": n})
        assert stream.count == 0
        await asyncio.sleep(0)  # the turn ends
        assert stream.count == 1
        assert [line["n"] for line in _lines(stream)] == [0, 1, 2]
        other = threading.Thread(target=logs.access, args=("inference", {"n": "thread"}))
        other.start()  # a line from another thread is written at once, not held for the loop
        other.join()
        assert stream.count == 2
        logs.access("inference", {"n": 3})
        await held.stop()  # what is held leaves at stop; later lines are written at once
        assert stream.count == 3
        logs.access("inference", {"n": 4})
        assert stream.count == 4

    asyncio.run(serve())
    lines = _lines(stream)
    assert [line["n"] for line in lines] == [0, 1, 2, "thread", 3, 4]
    assert {line["location"] for line in lines} == {"access"}
    assert all(str(line["timestamp"]).endswith("+0000") and "," in str(line["timestamp"]) for line in lines)


def test_without_a_server_each_line_is_written_and_flushed_at_once(stream: Writes) -> None:
    logs.access("inference", {"n": 0})
    assert stream.count == 1 and _lines(stream)[0]["n"] == 0
