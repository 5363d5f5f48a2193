"""Test helpers: tiny real ONNX models built in the test, and the demo model paths."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper
from packaging.requirements import Requirement

from fnserve.core.codec.tensors import InferenceRequest
from fnserve.core.jobs.results import ResultRecord

REPO = Path(__file__).resolve().parents[2]
DEMO_MANIFEST = REPO / "layers" / "models" / "models" / "manifest.toml"
DEMO_HOLDOUT = REPO / "layers" / "models" / "models" / "digits-holdout.npz"


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value + '"'
    return str(value)


def scale_model() -> onnx.ModelProto:
    """x: FP32 [N, 3], k: INT64 [N]  ->  y = 2x (FP32 [N, 3]), k1 = k + 1 (INT64 [N])."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["y"]),
            helper.make_node("Add", ["k", "one"], ["k1"]),
        ],
        "scale",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("k", TensorProto.INT64, ["N"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("k1", TensorProto.INT64, ["N"]),
        ],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def slow_model(width: int = 1024, layers: int = 100) -> onnx.ModelProto:
    """x: FP32 [N, 8] -> y: FP32 [N], the mean of ``layers`` MatMul + Tanh of width ``width``: ~0.2 GFLOP a
    row at the defaults, so N (in a small request, for a small answer) sets how long a call runs."""
    import numpy as np

    rng = np.random.default_rng(0)
    first = (rng.standard_normal((8, width)) / np.sqrt(8)).astype(np.float32)
    weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    nodes, previous = [helper.make_node("MatMul", ["x", "w0"], ["h"])], "h"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"m{i}"]))
        previous = f"t{i}"
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [previous]))
    nodes.append(helper.make_node("ReduceMean", [previous], ["y"], axes=[1], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        initializer=[onnx.numpy_helper.from_array(first, "w0"), onnx.numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def model_bytes(model: onnx.ModelProto | None = None) -> bytes:
    return (model or scale_model()).SerializeToString()


DIGITS_ACCURATE = DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"


def save_with_external_data(
    target: Path, source: Path = DIGITS_ACCURATE, location: str = "model.onnx.data", one_file: bool = True
) -> Path:
    """``source`` saved as ``target`` with its weights in the file ``location`` beside it (external data, as exporters
    save graphs over 2 GB), or, not ``one_file``, each in a file named after it; the data file's path (the first
    weight's, not ``one_file``)."""
    model = onnx.load(source)
    for tensor in model.graph.initializer:  # as raw bytes: onnx moves only those out of the graph
        tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name))
    target.parent.mkdir(parents=True, exist_ok=True)
    # onnx's default threshold keeps small tensors in (onnxruntime infers shapes from those, a Reshape's among them).
    onnx.save_model(model, target, save_as_external_data=True, all_tensors_to_one_file=one_file, location=location)
    return target.parent / (location if one_file else model.graph.initializer[0].name)


ManifestWriter = Callable[..., Path]


ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def identity_model() -> onnx.ModelProto:
    """One Identity per V2 datatype: input ``in_<TYPE>`` [N, 2] -> output ``out_<TYPE>``."""
    nodes, inputs, outputs = [], [], []
    for name, onnx_type in ONNX_TYPES.items():
        nodes.append(helper.make_node("Identity", [f"in_{name}"], [f"out_{name}"]))
        inputs.append(helper.make_tensor_value_info(f"in_{name}", onnx_type, ["N", 2]))
        outputs.append(helper.make_tensor_value_info(f"out_{name}", onnx_type, ["N", 2]))
    model = helper.make_model(
        helper.make_graph(nodes, "identity", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def sample_arrays(rows: int = 3) -> dict[str, Any]:
    """A value of every datatype, shaped [rows, 2], with extremes where the type has them."""
    import numpy as np

    from fnserve.core.models.datatypes import V2_TO_NUMPY

    out: dict[str, Any] = {}
    for name, dtype in V2_TO_NUMPY.items():
        if name == "BOOL":
            values = np.array([True, False] * rows).reshape(rows, 2)
        elif name == "BYTES":
            values = np.array([f"s{i}-é".encode() for i in range(rows * 2)], dtype=object).reshape(rows, 2)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype.name)
            values = np.array([info.min, info.max] + list(range(rows * 2 - 2)), dtype=dtype).reshape(rows, 2)
        else:
            values = (np.arange(rows * 2, dtype=dtype) / 4 - 0.5).reshape(rows, 2)
        out[name] = values
    return out


def write_test_manifest(directory: Path, cache_ttl: int | None = None, cascade: bool = False) -> Path:
    """A manifest with the demo models (by absolute path) plus the all-datatypes identity model.

    ``cache_ttl`` turns the result cache on for the demo models; ``cascade`` adds the demo cascade.
    """
    import hashlib
    import tomllib

    data = identity_model().SerializeToString()
    (directory / "identity.onnx").write_bytes(data)
    # The digits models only: the tests that use this manifest need no 22 MB transformer loaded.
    demo = [m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"] if m["name"].startswith("digits")]
    lines = []
    for entry in demo:
        lines += [
            "[[models]]",
            f'name = "{entry["name"]}"',
            f'path = "{DEMO_MANIFEST.parent / entry["path"]}"',
            f'sha256 = "{entry["sha256"]}"',
        ]
        if cache_ttl is not None:
            lines.append(f"cache_ttl_seconds = {cache_ttl}")
    lines += ["[[models]]", 'name = "identity"', 'path = "identity.onnx"']
    lines += [f'sha256 = "{hashlib.sha256(data).hexdigest()}"']
    if cascade:
        for entry in tomllib.loads(DEMO_MANIFEST.read_text())["cascades"][:1]:  # the tensor one
            lines.append("[[cascades]]")
            lines += [f"{key} = {_toml(value)}" for key, value in entry.items()]
    manifest = directory / "manifest.toml"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


class MemoryStore:
    """An in-memory result store that counts its reads."""

    def __init__(self) -> None:
        self.records: dict[str, ResultRecord] = {}
        self.reads = 0

    def get(self, keys: Iterable[str]) -> dict[str, ResultRecord]:
        self.reads += 1
        return {k: self.records[k] for k in keys if k in self.records}

    def put(self, records: Sequence[ResultRecord]) -> set[str]:
        self.records.update((r.key, r) for r in records)
        return set()


class MemoryBackend:
    """An in-memory shared tier."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[bytes, float]] = {}
        self.gets = 0

    def get_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, float]]:
        self.gets += 1
        return {k: self.entries[k] for k in keys if k in self.entries}

    def put_many(self, entries: Mapping[str, bytes], ttl_seconds: int) -> None:
        for key, blob in entries.items():
            self.entries[key] = (blob, 4_000_000_000)


def manifest_of(models: str, base_dir: str, warmup: bool = True) -> str:
    """A manifest holding one entry of the demo manifest (a model, or a pipeline and its model), ``base_dir`` where
    the demo's files are; ``warmup = false`` on its model for the step-by-step start."""
    demo = tomllib.loads(DEMO_MANIFEST.read_text())
    pipeline = next((p for p in demo.get("pipelines", []) if p["name"] == models), None)
    model = next(m for m in demo["models"] if m["name"] == (pipeline["model"] if pipeline else models))
    lines = [f"base_dir = {json.dumps(base_dir)}", "", "[[models]]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in model.items()]
    lines += [] if warmup else ["warmup = false"]
    if pipeline is not None:
        lines += ["", "[[pipelines]]"] + [
            f"{k} = {json.dumps(v)}" for k, v in pipeline.items() if k not in ("pre", "post")
        ]
        for kind in ("pre", "post"):
            for step in pipeline.get(kind, []):
                lines += [f"[[pipelines.{kind}]]"] + [f"{key} = {json.dumps(value)}" for key, value in step.items()]
    return "\n".join(lines) + "\n"


def digits_body(datatype: str, data: str) -> str:
    """A V2 request for the digits models whose 64 values are ``data`` (raw JSON text) of ``datatype``."""
    return f'{{"inputs": [{{"name": "input", "shape": [1, 64], "datatype": "{datatype}", "data": {data}}}]}}'


# Client input that numpy once turned into a 500 (OverflowError) or silently into infinities.
BAD_NUMBERS = [
    (digits_body("UINT64", "[" + ", ".join(["true"] * 64) + "]"), "UINT64 data must be numbers, got true/false"),
    (digits_body("INT64", "[" + ", ".join(["1180591620717411303424"] * 64) + "]"), "values out of range for INT64"),
    (digits_body("FP32", "[" + ", ".join(["1e39"] * 64) + "]"), "values out of range for FP32"),
    (digits_body("FP16", "[" + ", ".join(["70000"] * 64) + "]"), "values out of range for FP16"),
]


def dockerfile_instructions(name: str, dockerfile: Path | None = None) -> list[str]:
    """The arguments of every ``name`` instruction of a Dockerfile's last stage (the server image's by default),
    continuation lines joined."""
    text = (dockerfile or REPO / "infra" / "container" / "Dockerfile").read_text().replace("\\\n", " ")
    last_stage = text[text.rindex("\nFROM ") :]
    return [m.group(1).strip() for m in re.finditer(rf"(?m)^{name} (.*)$", last_stage)]


def demo_labels(model: str, rows: Any) -> list[int]:
    """The labels onnxruntime itself gives a digits demo model's ``rows``: what a served answer must match."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
    return [int(label) for label in session.run(["label"], {"input": np.asarray(rows, dtype=np.float32)})[0]]


def close_main_loop() -> None:
    """Close the event loop left set for the main thread (Mangum makes one, as Lambda keeps one), if any.

    Left alone, it is collected at a random later point, and its unclosed sockets fail whichever
    test is running then (warnings are errors here)."""
    import asyncio
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:  # none is set: nothing to close
        return
    loop.close()
    asyncio.set_event_loop(None)


def post_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """An ASGI HTTP scope of a POST to ``path``, for calling an app without a server."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }


async def body_never_comes() -> dict[str, object]:
    """An ASGI ``receive`` whose body never arrives: what a server that refuses from the headers alone never reads."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def load_module(path: Path, name: str) -> ModuleType:
    """The Python file at ``path`` imported as a fresh module ``name`` (a script of infra/, a function's app.py);
    registered in ``sys.modules`` first, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirements(extras: Iterable[str]) -> list[str]:
    """fnserve's own requirements with ``extras``, its self-references (``fnserve[lambda]``) followed."""
    found, seen, todo = list(PROJECT["dependencies"]), set(), list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in PROJECT["optional-dependencies"][extra]:
            requirement = Requirement(line)
            if requirement.name == "fnserve":
                todo += sorted(requirement.extras)
            else:
                found.append(line)
    return sorted(set(found))


class Arrived:
    """A request for :meth:`DataPlane.serve` with its tensors already in hand: answered as ``encode`` writes it
    (the answer itself by default); ``on_read`` is called when the plane reads its body."""

    def __init__(
        self,
        name: str,
        inputs: dict[str, Any],
        encode: Callable[[Any, InferenceRequest], Any] | None = None,
        *,
        version: str | None = None,
        deadline: float | None = None,
        traceparent: str | None = None,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self.name, self.version, self.deadline, self.traceparent = name, version, deadline, traceparent
        self._inputs, self._encode, self._on_read = inputs, encode, on_read
        self._request: InferenceRequest | None = None

    async def decoded(self) -> InferenceRequest:
        if self._on_read is not None:
            self._on_read()
        self._request = InferenceRequest(self._inputs)
        return self._request

    def encode(self, answer: Any) -> Any:
        assert self._request is not None
        return answer if self._encode is None else self._encode(answer, self._request)


GPU_ONLY = {"gpu", "tensorrt"}  # extras whose wheels need a GPU machine
DOCKERFILES = sorted((REPO / "infra" / "container").glob("*Dockerfile"))


def documented() -> dict[frozenset[str], str]:
    """Every extra set an install instruction names, with where it is named."""
    found: dict[frozenset[str], str] = {}
    for path in [*DOCKERFILES, REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for extras in re.findall(r"""pip install[^\n]*?(?:\.|fnserve)\[([a-z0-9_,-]+)\]""", path.read_text()):
            wanted = frozenset(extras.split(",")) - GPU_ONLY
            found.setdefault(wanted, path.name)
    return found
