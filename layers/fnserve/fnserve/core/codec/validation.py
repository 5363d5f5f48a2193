"""A request's tensors checked against what a model or pipeline takes: names, datatypes, shapes, values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fnserve.core.errors import InvalidInput
from fnserve.core.models.datatypes import Arrays, can_cast
from fnserve.core.models.registry import TensorSpec

_MISSING: Any = object()


def check(
    specs: Sequence[TensorSpec], kind: str, name: str, inputs: Mapping[str, Any], *, strings: bool
) -> tuple[Arrays, int]:
    """The feed (each input cast where that is safe) and its batch size, or an :class:`InvalidInput` saying
    what is wrong. ``strings``: BYTES become ``str`` objects, as onnxruntime takes them (a model's inputs;
    a pipeline's steps take the bytes as sent)."""
    if len(inputs) != len(specs):
        _raise_names(specs, kind, name, inputs)
    feed: Arrays = {}
    batch = -1
    for spec in specs:
        array = inputs.get(spec.name, _MISSING)
        if array is _MISSING:
            _raise_names(specs, kind, name, inputs)
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        if array.dtype != spec.dtype:
            array = _cast(spec, kind, name, array)
        if strings and spec.datatype == "BYTES":
            array = _strings(spec, kind, name, array)
        shape = array.shape
        if len(shape) != len(spec.shape):
            if shape[1:] == (1,) and spec.shape == (-1,):
                # [batch, 1] for a [batch] input: Triton's reshape of dims [1] to [], as the model configuration
                # of such an input says (fnserve.core.serving.model_config); clients written for Triton send that.
                array = array.reshape(shape[0])
                shape = array.shape
            else:
                raise InvalidInput(
                    f"input {spec.name!r} of {kind} {name!r} must have rank {len(spec.shape)} "
                    f"(shape {list(spec.shape)}), got shape {list(shape)}"
                )
        if shape != spec.shape:  # equal only where no dimension varies; else each fixed one is checked
            for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
                if want != -1 and want != got:
                    raise InvalidInput(
                        f"input {spec.name!r} of {kind} {name!r} must have {want} at axis {axis} "
                        f"(shape {list(spec.shape)}), got shape {list(shape)}"
                    )
        if shape and spec.shape[0] == -1:
            if shape[0] == 0:
                raise InvalidInput(f"input {spec.name!r} of {kind} {name!r} is an empty batch")
            if batch == -1:
                batch = shape[0]
            elif shape[0] != batch:
                raise InvalidInput(
                    f"inputs of {kind} {name!r} disagree on the batch size: "
                    f"{spec.name!r} has {shape[0]}, another input has {batch}"
                )
        feed[spec.name] = array
    return feed, batch


def _raise_names(specs: Sequence[TensorSpec], kind: str, name: str, inputs: Mapping[str, Any]) -> None:
    expected = [spec.name for spec in specs]
    missing = [n for n in expected if n not in inputs]
    extra = sorted(str(n) for n in inputs if n not in expected)
    parts = []
    if missing:
        parts.append(f"missing inputs {missing}")
    if extra:
        parts.append(f"unexpected inputs {extra}")
    raise InvalidInput(f"{kind} {name!r} takes inputs {expected}: {'; '.join(parts)}")


def _cast(spec: TensorSpec, kind: str, name: str, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if not can_cast(array.dtype, spec.dtype):
        raise InvalidInput(
            f"input {spec.name!r} of {kind} {name!r} must be {spec.datatype} "
            f"({spec.dtype}); {array.dtype} cannot be cast to it safely"
        )
    if array.dtype.kind == "f" and spec.dtype.itemsize < array.dtype.itemsize:  # FP64 to FP32: finite stays finite
        with np.errstate(over="ignore"):
            narrowed = array.astype(spec.dtype)
        if (np.isinf(narrowed) & np.isfinite(array)).any():
            raise InvalidInput(f"input {spec.name!r} of {kind} {name!r}: values out of range for {spec.datatype}")
        return narrowed
    return array.astype(spec.dtype)


def _strings(spec: TensorSpec, kind: str, name: str, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # ONNX Runtime takes string tensors as str objects (it would str() a bytes object into "b'..'").
    out = np.empty(array.shape, dtype=object)
    try:
        out.ravel()[:] = [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()]
    except UnicodeDecodeError:
        raise InvalidInput(f"input {spec.name!r} of {kind} {name!r}: BYTES elements must be UTF-8") from None
    return out
