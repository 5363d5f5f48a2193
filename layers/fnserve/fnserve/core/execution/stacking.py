"""Stacking: a batch's requests as one runtime call, and its outputs split back to them.

Requests queue by shape (:meth:`Stacking.key`): their length bucket and each input's padded row shape, so that only
requests that stack share a batch, and one of another length never fails a batch it cannot join. Inputs are
concatenated along axis 0, variable-length inputs padded up to their bucket's length; outputs are split back by
each request's rows, checked to split exactly. On a CPU (``pad_to_bucket`` false) a batch is padded only up to its
longest request: a padded token costs as much as a real one. A GPU keeps the bucket lengths it warmed at start, and
with ``batch_buckets`` a batch's rows are padded up to the next bucket (zeros, their outputs dropped), so that it
sees a few batch shapes. The runner (:mod:`fnserve.core.execution.runner`) stacks every batch so, whatever gathered
it. What each choice was measured to gain: docs/design/batching.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fnserve.core.codec.rows import split_rows
from fnserve.core.execution.embeddings import TokenBudget
from fnserve.core.models.datatypes import Arrays

if TYPE_CHECKING:
    from fnserve.core.models.manifest.models import ModelSettings

QueueKey = tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]  # length bucket, and each input's padded row shape


class Stacked(Protocol):
    """A request as a batch stacks it and answers it."""

    @property
    def inputs(self) -> Arrays: ...
    @property
    def rows(self) -> int: ...
    @property
    def length(self) -> int: ...  # of its variable-length inputs (0 when nothing is padded)


@dataclass(slots=True)
class Failed:
    """A request's error alone (its ``finish`` raised, or its run failed): the batch's other answers kept."""

    error: Exception


class Stacking:
    """How one model's requests stack: ``buckets``, the lengths its variable-length inputs (``pad_inputs``) are
    padded up to, with ``pad_value``; ``batch_buckets``, the row counts a batch is padded up to; ``pad_to_bucket``
    false: a batch padded only to its longest request (on a CPU)."""

    def __init__(
        self,
        buckets: Sequence[int] = (),
        batch_buckets: Sequence[int] = (),
        pad_inputs: Sequence[str] = (),
        pad_value: float = 0.0,
        pad_to_bucket: bool = True,
        budget: TokenBudget | None = None,
    ) -> None:
        self.buckets = sorted(buckets)
        self.batch_buckets = sorted(batch_buckets)
        self.pad_inputs = tuple(pad_inputs)
        self.pad_value = pad_value
        self.pad_to_bucket = pad_to_bucket
        self.budget = budget  # set: every length in one queue, batches cut by what their padded tokens cost

    @classmethod
    def of(cls, settings: ModelSettings) -> Stacking:
        """The stacking of a model's manifest entry."""
        # A GPU sees the bucket lengths it warmed at start; a CPU runs no padding it can do without.
        cpu_only = settings.execution_providers == ["CPUExecutionProvider"]
        return cls(
            settings.length_buckets,
            settings.batch_buckets,
            settings.pad_inputs,
            settings.pad_value,
            pad_to_bucket=bool(settings.batch_buckets) or not cpu_only,
            budget=TokenBudget.of(settings),
        )

    def length(self, inputs: Arrays) -> int:
        """The length of this request's variable-length inputs (0 when nothing is padded)."""
        lengths = [inputs[name].shape[1] for name in self.pad_inputs if name in inputs and inputs[name].ndim > 1]
        return max(lengths, default=0)

    def bucket(self, length: int) -> int:
        """The padded length of a request whose variable-length inputs are ``length`` long (0: nothing padded)."""
        if not length:
            return 0
        i = bisect.bisect_left(self.buckets, length)
        return self.buckets[i] if i < len(self.buckets) else length  # longer than every bucket: alone

    def key(self, inputs: Arrays, bucket: int) -> QueueKey:
        """The queue of a request of ``bucket``: only requests of one key stack. Under a token budget every length
        shares one queue (the variable-length axis counts as -1): a batch is cut by length when it forms."""
        if self.budget is not None:
            return 0, tuple((name, self._any_length(a, name)) for name, a in sorted(inputs.items()))
        return bucket, tuple((name, self._row_shape(a, name, bucket)) for name, a in sorted(inputs.items()))

    def padded(self, length: int) -> int:
        """The length a batch whose longest request is ``length`` long is padded to."""
        return self.bucket(length) if self.pad_to_bucket else length

    def stack(self, batch: Sequence[Stacked], bucket: int) -> tuple[Arrays, list[int]]:
        """``batch``'s inputs as one batch, and the rows to split its outputs by (each request's, then the batch
        bucket's padding, if any)."""
        rows = [p.rows for p in batch]
        padding = self._batch_padding(sum(rows))
        length = bucket if self.pad_to_bucket else max(p.length for p in batch)
        names = list(batch[0].inputs)
        stacked = {name: self._stack([p.inputs[name] for p in batch], name, length, padding) for name in names}
        return stacked, rows + [padding] if padding else rows

    def _batch_padding(self, rows: int) -> int:
        """Rows of zeros that bring a batch up to its batch bucket (none past the largest)."""
        i = bisect.bisect_left(self.batch_buckets, rows)
        return self.batch_buckets[i] - rows if i < len(self.batch_buckets) else 0

    def _pads(self, array: np.ndarray[Any, Any], name: str, bucket: int) -> bool:
        return bool(bucket) and name in self.pad_inputs and array.ndim >= 2 and array.shape[1] != bucket

    def _any_length(self, array: np.ndarray[Any, Any], name: str) -> tuple[int, ...]:
        """The shape of one row of ``array`` with its variable-length axis as -1, which a batch decides."""
        if name in self.pad_inputs and array.ndim >= 2:
            return (-1, *array.shape[2:])
        return tuple(array.shape[1:])

    def _row_shape(self, array: np.ndarray[Any, Any], name: str, bucket: int) -> tuple[int, ...]:
        """The shape of one row of ``array`` once padded to ``bucket`` (without padding it)."""
        if not self._pads(array, name, bucket):
            return tuple(array.shape[1:])
        return (bucket, *array.shape[2:])

    def _stack(self, arrays: list[np.ndarray[Any, Any]], name: str, length: int, padding: int) -> np.ndarray[Any, Any]:
        """``arrays`` one after another along axis 0, each padded to ``length`` along axis 1 when ``name`` is a padded
        input, then ``padding`` rows of zeros (a batch bucket's). Written into one array made at once, not padded a
        request at a time (``np.pad`` is dear beside the run)."""
        first = arrays[0]
        if not padding and not any(self._pads(a, name, length) for a in arrays):
            return first if len(arrays) == 1 else np.concatenate(arrays)
        rows = sum(a.shape[0] for a in arrays)
        shape = (rows + padding, *self._row_shape(first, name, length))
        if first.dtype == object:
            out = np.full(shape, b"", dtype=object)
        else:
            out = np.full(shape, self.pad_value if name in self.pad_inputs else 0, dtype=first.dtype)
        row = 0
        for array in arrays:
            out[(slice(row, row + array.shape[0]), *(slice(0, n) for n in array.shape[1:]))] = array
            row += array.shape[0]
        if padding:
            out[rows:] = b"" if first.dtype == object else 0
        return out


Finish = Callable[[Arrays, str | None], Any]  # what a request's outputs become, told the device that ran them


def answers(
    outputs: Arrays, rows: list[int], finishes: Sequence[Finish | None], device: str | None = None, split: bool = True
) -> list[Any]:
    """A batch's ``outputs`` split back by ``rows`` (:meth:`Stacking.stack`'s), each request's part made what its
    ``finish`` makes of it and ``device`` (a :class:`Failed` where that raised); a batch bucket's padding dropped.
    ``split`` false: one request's, its outputs whole (a model that reduces over the batch)."""
    parts = split_rows(outputs, rows, "batched inference") if split else [outputs]
    return [_finished(finish, part, device) for finish, part in zip(finishes, parts[: len(finishes)], strict=True)]


def _finished(finish: Finish | None, part: Arrays, device: str | None) -> Any:
    if finish is None:
        return part
    try:
        return finish(part, device)
    except Exception as exc:
        return Failed(exc)
