"""Requests stacked along the batch axis: each one's rows, and splitting outputs back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fnserve.core.errors import InferenceError
from fnserve.core.models.datatypes import Arrays


def batch_size(inputs: Mapping[str, Any]) -> int:
    """The rows of a request or a run: its first input's first dimension (1 where it has none, or no inputs)."""
    for value in inputs.values():
        shape = getattr(value, "shape", None)
        return int(shape[0]) if shape else 1
    return 1


def row_bounds(rows: Sequence[int]) -> list[int]:
    """Where each request's rows start, and where the last ends: ``[0, r0, r0 + r1, ...]``."""
    return np.cumsum([0, *rows]).tolist()  # type: ignore[no-any-return]


_RESHAPED = 512  # requests from which slice_rows reshapes alike ones instead of slicing each


def slice_rows(arrays: Mapping[str, np.ndarray[Any, Any]], rows: Sequence[int]) -> list[Arrays]:
    """Each request's rows of every array, in order (views, not copies, where the arrays allow).

    Plain slices, not np.split: it costs several times more per piece, and there is a piece per request. Many
    alike requests (a queue's jobs of one row each) take one reshape an array instead: past ``_RESHAPED`` requests
    it costs less than their slices, below it more (docs/design/jobs.md).
    """
    count = len(rows)
    if arrays and count >= _RESHAPED and rows.count(rows[0]) == count:
        names, width = list(arrays), rows[0]
        columns = [list(a.reshape(count, width, *a.shape[1:])) for a in arrays.values()]
        return [dict(zip(names, parts, strict=True)) for parts in zip(*columns, strict=True)]
    items = arrays.items()
    pieces = []
    start = 0
    for n in rows:
        end = start + n
        pieces.append({name: array[start:end] for name, array in items})
        start = end
    return pieces


def take_rows(arrays: Mapping[str, np.ndarray[Any, Any]], rows: Sequence[int], keep: Sequence[int]) -> Arrays:
    """The rows of only the requests at positions ``keep``, stacked again (a copy)."""
    bounds = row_bounds(rows)
    take = np.concatenate([np.arange(bounds[j], bounds[j + 1]) for j in keep])
    return {name: array[take] for name, array in arrays.items()}


def split_rows(outputs: Mapping[str, np.ndarray[Any, Any]], rows: Sequence[int], what: str) -> list[Arrays]:
    """:func:`slice_rows` of a stacked run's outputs, refusing outputs that do not split exactly."""
    check_rows(outputs, rows, what)
    return slice_rows(outputs, rows)


def check_rows(outputs: Mapping[str, np.ndarray[Any, Any]], rows: Sequence[int], what: str) -> None:
    """Refuse a stacked run's outputs unless each has a row per input row, so they split back exactly."""
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise InferenceError(
                f"{what}: output {name!r} has shape {list(array.shape)}, which does not split back into "
                f"the {len(rows)} stacked requests ({total} rows)"
            )
