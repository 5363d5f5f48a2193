"""Test helpers: tiny real ONNX models built in the test, and the demo model paths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
DEMO_MANIFEST = REPO / "layers" / "models" / "models" / "manifest.toml"
DEMO_HOLDOUT = REPO / "layers" / "models" / "models" / "digits-holdout.npz"


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


def model_bytes(model: onnx.ModelProto | None = None) -> bytes:
    return (model or scale_model()).SerializeToString()


ManifestWriter = Callable[..., Path]
