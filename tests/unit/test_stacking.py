"""Stacking and the runner alone: requests padded and stacked into one batch, outputs split back, a failed batch
split in halves."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from fnserve.core.errors import InvalidInput, ModelNotReady
from fnserve.core.execution.runner import Runner
from fnserve.core.execution.servable import Ran
from fnserve.core.execution.stacking import Failed, Stacking, answers


@dataclass
class Request:
    inputs: dict[str, np.ndarray]
    rows: int = 1
    length: int = 0
    finish: Any = None


def test_a_batch_is_padded_to_its_bucket_or_its_longest_request_then_to_its_batch_bucket() -> None:
    async def main() -> None:
        short, longer = Request({"x": np.ones((1, 3))}, length=3), Request({"x": np.ones((2, 5))}, rows=2, length=5)
        gpu = Stacking(buckets=[8], batch_buckets=[4], pad_inputs=["x"], pad_value=-1.0)
        stacked, rows = gpu.stack([short, longer], gpu.bucket(5))
        assert stacked["x"].shape == (4, 8) and rows == [1, 2, 1]  # a batch bucket's row of padding
        assert stacked["x"][0].tolist() == [1, 1, 1, -1, -1, -1, -1, -1] and not stacked["x"][3].any()
        cpu = Stacking(buckets=[8], pad_inputs=["x"], pad_to_bucket=False)
        stacked, rows = cpu.stack([short, longer], cpu.bucket(5))
        assert stacked["x"].shape == (3, 5) and rows == [1, 2]  # its longest request's length: no more
        assert cpu.key(short.inputs, 8) == cpu.key(longer.inputs, 8) == (8, (("x", (8,)),))

    asyncio.run(main())


def test_outputs_split_back_without_the_padding_and_a_then_that_raises_fails_its_request_alone() -> None:
    def boom(part: dict[str, np.ndarray], device: str | None) -> Any:
        raise InvalidInput("not this one")

    outputs = {"y": np.arange(4)}
    first, second = answers(outputs, [1, 2, 1], [None, boom])
    assert first["y"].tolist() == [0]
    assert isinstance(second, Failed) and isinstance(second.error, InvalidInput)


def test_a_failed_batch_is_split_in_halves_until_its_culprit_fails_alone() -> None:
    """Of five requests, the fourth fails any run it is in: the batch, then its half, then its quarter fail; the
    others are answered, and it gets its own error."""
    batch = [Request({"x": np.full((1, 1), i)}) for i in range(5)]
    sizes: list[int] = []
    splits = []

    def call(stacked: dict[str, np.ndarray], rows: int) -> Ran:
        sizes.append(len(stacked["x"]))
        if (stacked["x"] == 3).any():
            raise InvalidInput("request 3 is bad")
        return Ran({"y": stacked["x"]}, None)

    runner = Runner(on_split=lambda: splits.append(1))
    settled = dict(enumerate(runner.run(batch, call)))
    assert sizes == [5, 2, 3, 1, 2, 1, 1] and len(splits) == runner.splits == 3
    assert {i: int(part["y"][0, 0]) for i, part in settled.items() if not isinstance(part, Failed)} == {
        0: 0,
        1: 1,
        2: 2,
        4: 4,
    }
    assert isinstance(settled[3], Failed) and settled[3].error.message == "request 3 is bad"  # type: ignore[attr-defined]


def test_a_model_not_ready_fails_the_whole_batch_at_once() -> None:
    batch = [Request({"x": np.ones((1, 1))}) for _ in range(4)]
    runs = []

    def call(stacked: dict[str, np.ndarray], rows: int) -> Ran:
        runs.append(len(stacked["x"]))
        raise ModelNotReady("still loading")

    settled = Runner().run(batch, call)
    assert len(runs) == 1 and len(settled) == 4 and all(isinstance(p, Failed) for p in settled)
