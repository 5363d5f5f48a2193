"""Splitting stacked outputs back into the requests they came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fnserve.core.errors import InferenceError

Arrays = dict[str, np.ndarray[Any, Any]]


def split_rows(outputs: Mapping[str, np.ndarray[Any, Any]], rows: list[int], what: str) -> list[Arrays]:
    """Each request's rows of every output, in order; refuses outputs that do not split exactly.

    Plain slices, not np.split: it costs several times more per piece, and there is a piece per request.
    """
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise InferenceError(
                f"{what}: output {name!r} has shape {list(array.shape)}, which does not split back into "
                f"the {len(rows)} stacked requests ({total} rows)"
            )
    bounds = np.cumsum([0, *rows]).tolist()
    return [{name: array[bounds[j] : bounds[j + 1]] for name, array in outputs.items()} for j in range(len(rows))]
