"""The three names of a tensor element type: ONNX Runtime's, numpy's and the V2 protocol's."""

from __future__ import annotations

from typing import Any

import numpy as np

from fnserve.core.errors import InvalidInput

# Named tensors: what models take and give, and what every layer passes around.
Arrays = dict[str, np.ndarray[Any, Any]]

# V2 datatype -> numpy dtype. BYTES tensors are numpy object arrays of ``bytes``.
V2_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_V2: dict[np.dtype[np.generic], str] = {dtype: name for name, dtype in V2_TO_NUMPY.items()}

# ONNX Runtime's ``NodeArg.type`` strings.
ORT_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def v2_datatype(dtype: np.dtype[np.generic]) -> str:
    """The V2 datatype name of a numpy dtype (strings and bytes map to BYTES)."""
    name = NUMPY_TO_V2.get(dtype)
    if name is not None:
        return name
    if dtype.kind in "SUO":
        return "BYTES"
    raise InvalidInput(f"numpy dtype {dtype} has no V2 datatype")


def can_cast(src: np.dtype[np.generic], dst: np.dtype[np.generic]) -> bool:
    """fnserve's input casting rule: numpy's "safe" casts, plus float to narrower float.

    Float narrowing (float64 -> float32) loses only precision and is what every numpy
    caller produces by default; anything that could change a value's meaning (float to
    int, wider to narrower int, signed to unsigned) is refused.
    """
    if src == dst:
        return True
    if src.kind == "f" and dst.kind == "f":
        return True
    if dst.kind == "O":
        return src.kind in "SU"
    return bool(np.can_cast(src, dst, casting="safe"))
