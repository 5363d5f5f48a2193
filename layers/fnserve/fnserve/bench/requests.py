"""The requests a benchmark sends: made from the target's own metadata, read from a data file, or given as
V2 request files; and the model tensors they become, for the raw onnxruntime floor.

Requests are V2 JSON, except for a pipeline's image inputs, which travel as raw bytes in the binary
tensor extension (as a client sending photos would send them). A set of distinct requests is cycled
over, so that a model with a result cache is measured computing, not answering from its cache.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.core.codec.datafiles import read_data
from fnserve.core.codec.tensors import binary_tensor
from fnserve.core.errors import InvalidInput
from fnserve.core.execution.pipeline import Pipeline
from fnserve.core.models.datatypes import V2_TO_NUMPY
from fnserve.core.models.manifest.steps import ImageStep
from fnserve.core.models.registry import LoadedModel, TensorSpec

Arrays = dict[str, np.ndarray[Any, Any]]

DISTINCT = 32  # requests cycled over
SEQUENCE = 32  # the length given to a variable dimension past the batch axis
SENTENCES = (
    "the quick brown fox jumps over the lazy dog",
    "serverless inference answers in milliseconds once the container is warm",
    "a fast small model answers at once and a slow accurate one follows up",
    "profile before optimising: preprocessing often costs more than the model",
)


@dataclass(frozen=True)
class Request:
    """One request's body and headers, and its inputs as arrays (for the raw floor)."""

    body: bytes
    headers: dict[str, str]
    inputs: Arrays

    @property
    def rows(self) -> int:
        return int(next(iter(self.inputs.values())).shape[0])


@dataclass(frozen=True)
class Target:
    """What is benchmarked: a model or a pipeline, with its input specs and the model it runs."""

    name: str
    inputs: tuple[TensorSpec, ...]
    model: LoadedModel
    pipeline: Pipeline | None = None

    def model_feed(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        """The model tensors a request's inputs become (after a pipeline's pre steps)."""
        if self.pipeline is None:
            return {spec.name: np.asarray(inputs[spec.name], dtype=spec.dtype) for spec in self.model.inputs}
        return self.pipeline.stage(inputs).feed

    def image_inputs(self) -> set[str]:
        if self.pipeline is None:
            return set()
        return {step.input for step in self.pipeline.settings.pre if isinstance(step, ImageStep)}


def encode(target: Target, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Request:
    """A V2 request of ``inputs``: JSON, or the binary extension when one carries raw image bytes."""
    specs = {spec.name: spec for spec in target.inputs}
    if not target.image_inputs() & set(inputs):
        plain: list[dict[str, Any]] = []
        for name, array in inputs.items():
            data = [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]
            plain.append({"name": name, "shape": list(array.shape), "datatype": specs[name].datatype, "data": data})
        body = json.dumps({"inputs": plain}, separators=(",", ":")).encode()
        return Request(body, {"Content-Type": "application/json"}, dict(inputs))
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array in inputs.items():
        blob = binary_tensor(array, specs[name].datatype)
        tensors.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": specs[name].datatype,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    head = json.dumps({"inputs": tensors}, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    return Request(head + b"".join(blobs), headers, dict(inputs))


def synthetic(target: Target, rows: int = 1, count: int = DISTINCT, seed: int = 0) -> list[Request]:
    """``count`` distinct requests of ``rows`` rows made from the target's input metadata: floats uniform in
    [0, 1), integers and booleans 0 or 1 (safe as token ids, masks and type ids), sentences for text, and
    random-noise JPEGs for a pipeline's image inputs."""
    rng = np.random.default_rng(seed)
    images = target.image_inputs()
    found = []
    for n in range(count):
        inputs: Arrays = {}
        for spec in target.inputs:
            shape = [rows, *(SEQUENCE if d == -1 else d for d in spec.shape[1:])]
            if spec.datatype == "BYTES":
                size = int(np.prod(shape))
                if spec.name in images:
                    items = [_noise_jpeg(rng, n * size + i) for i in range(size)]
                else:
                    items = [f"{SENTENCES[(n + i) % len(SENTENCES)]} {n}".encode() for i in range(size)]
                inputs[spec.name] = np.array(items, dtype=object).reshape(shape)
            elif spec.datatype == "BOOL":
                inputs[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
            elif spec.dtype.kind in "iu":
                inputs[spec.name] = rng.integers(0, 2, size=shape).astype(spec.dtype)
            else:
                inputs[spec.name] = rng.random(size=shape).astype(spec.dtype)
        found.append(encode(target, inputs))
    return found


def _noise_jpeg(rng: np.random.Generator, n: int) -> bytes:
    from PIL import Image

    pixels = rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85 + n % 10)
    return out.getvalue()


def from_data(target: Target, path: Path, rows: int = 1, count: int = DISTINCT) -> list[Request]:
    """Requests of ``rows`` rows each from a .npy/.npz file of the target's inputs (at most ``count``)."""
    data = read_data(path, [spec.name for spec in target.inputs])
    if data.rows < rows:
        raise InvalidInput(f"{path} has {data.rows} rows, fewer than the {rows} a request takes")
    starts = range(0, data.rows - rows + 1, rows)
    return [encode(target, {k: v[s : s + rows] for k, v in data.inputs.items()}) for s in list(starts)[:count]]


def from_files(target: Target, paths: Sequence[Path]) -> list[Request]:
    """V2 JSON request files, sent as they are (their inputs read back for the raw floor)."""
    specs = {spec.name: spec for spec in target.inputs}
    found = []
    for path in paths:
        try:
            body = json.loads(path.read_bytes())
            inputs = {
                t["name"]: np.array(t["data"], dtype=_numpy(specs[t["name"]])).reshape(t["shape"])
                for t in body["inputs"]
            }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"{path} is not a V2 JSON request for {target.name!r}: {exc!r}") from None
        found.append(Request(path.read_bytes(), {"Content-Type": "application/json"}, inputs))
    return found


def _numpy(spec: TensorSpec) -> Any:
    return object if spec.datatype == "BYTES" else V2_TO_NUMPY[spec.datatype]
