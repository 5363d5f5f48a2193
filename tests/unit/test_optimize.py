"""``fnserve optimize``: a graph optimised once and saved, written only when it answers as the original does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from fnserve import optimize as o
from fnserve.cli import app

runner = CliRunner()


def folded_model(factor: float = 3.0) -> onnx.ModelProto:
    """x: FP32 [N, 4] -> y = x * (two + one): a constant ONNX Runtime folds at its basic level."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["two", "one"], ["three"]), helper.make_node("Mul", ["x", "three"], ["y"])],
        "folded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [factor - 1.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def answer(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def test_the_optimised_graph_is_saved_and_answers_as_the_original(tmp_path: Path) -> None:
    source, out = write(folded_model(), tmp_path / "model.onnx"), tmp_path / "optimized" / "model.onnx"
    result = runner.invoke(app, ["optimize", str(source), "-o", str(out), "--rounds", "10", "--starts", "3"])
    assert result.exit_code == 0, result.output
    assert "session creation" in result.output and "output y: max abs diff 0 (equal" in result.output
    assert f"wrote {out} (sha256 " in result.output
    # The constant was folded once, here: the saved graph is the multiplication alone.
    assert [node.op_type for node in onnx.load(str(out)).graph.node] == ["Mul"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(answer(out, x), answer(source, x))


def test_a_model_with_a_string_output_is_compared_exactly(tmp_path: Path) -> None:
    """A classifier's labels may be strings: compared for equality, with no distance to print."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["y"]),
            helper.make_node(
                "Constant", [], ["label"], value=helper.make_tensor("seven", TensorProto.STRING, [1], [b"seven"])
            ),
        ],
        "labelled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("label", TensorProto.STRING, [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source, out = write(model, tmp_path / "model.onnx"), tmp_path / "out.onnx"
    result = runner.invoke(app, ["optimize", str(source), "-o", str(out), "--rounds", "10", "--starts", "3"])
    assert result.exit_code == 0, result.output
    assert "output label: max abs diff 0 (equal" in result.output and out.exists()


def test_a_graph_that_answers_otherwise_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, out = write(folded_model(), tmp_path / "model.onnx"), tmp_path / "out.onnx"
    monkeypatch.setattr(o, "optimize", lambda src, dst, level: write(folded_model(factor=3.01), dst))
    result = runner.invoke(app, ["optimize", str(source), "-o", str(out), "--rounds", "10", "--starts", "3"])
    assert result.exit_code == 1
    assert "its output(s) y differ" in result.output and not out.exists()
    forced = runner.invoke(app, ["optimize", str(source), "-o", str(out), "--rounds", "10", "--starts", "3", "--force"])
    assert forced.exit_code == 0 and out.exists()


def test_the_level_that_writes_this_cpus_layouts_is_refused(tmp_path: Path) -> None:
    source = write(folded_model(), tmp_path / "model.onnx")
    result = runner.invoke(app, ["optimize", str(source), "-o", str(tmp_path / "out.onnx"), "--level", "all"])
    assert result.exit_code == 1
    assert "--level must be basic or extended, not 'all'" in result.output
