"""Reading model inputs (and optional labels) from .npy / .npz files for the CLI tools."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.core.errors import InvalidInput

LABEL_KEYS = ("labels", "label", "y")


@dataclass(frozen=True)
class DataFile:
    """Inputs keyed by model input name, and the true labels when the file carries them."""

    inputs: dict[str, np.ndarray[Any, Any]]
    labels: np.ndarray[Any, Any] | None

    @property
    def rows(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])

    def head(self, count: int) -> DataFile:
        """The first ``count`` rows."""
        return DataFile(
            {k: v[:count] for k, v in self.inputs.items()},
            None if self.labels is None else self.labels[:count],
        )


def read_data(path: str | Path, input_names: Sequence[str]) -> DataFile:
    """Inputs for a model with ``input_names`` from .npy (one input) or .npz (keyed by name).

    An .npz for a one-input model may name its array ``X`` or ``inputs`` instead; labels are
    read from ``labels``, ``label`` or ``y`` when present.
    """
    path = Path(path)
    if path.suffix == ".npy":
        if len(input_names) != 1:
            raise InvalidInput(f"{path}: a .npy file holds one array, the model takes {list(input_names)}")
        return DataFile({input_names[0]: np.load(path, allow_pickle=False)}, None)
    if path.suffix != ".npz":
        raise InvalidInput(f"{path}: expected a .npy or .npz file")
    with np.load(path, allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    labels = next((arrays.pop(k) for k in LABEL_KEYS if k in arrays), None)
    if len(input_names) == 1 and input_names[0] not in arrays:
        for alias in ("X", "inputs"):
            if alias in arrays:
                arrays[input_names[0]] = arrays.pop(alias)
                break
    missing = [name for name in input_names if name not in arrays]
    if missing:
        raise InvalidInput(f"{path}: no arrays for inputs {missing}; it holds {sorted(arrays)}")
    inputs = {name: arrays[name] for name in input_names}
    rows = {a.shape[0] for a in inputs.values()}
    if len(rows) != 1 or (labels is not None and labels.shape[0] not in rows):
        raise InvalidInput(f"{path}: arrays disagree on the number of rows")
    return DataFile(inputs, labels)
