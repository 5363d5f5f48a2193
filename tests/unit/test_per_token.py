"""Per-token int8 quantization on a small transformer block made here: a row's answer depends on that row alone,
``fnserve quantize`` chooses it for a transformer and says so, measured; onnxruntime's dynamic int8 does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from fnserve.cli import app
from fnserve.core.codec.datafiles import DataFile
from fnserve.per_token import quantize_per_token
from fnserve.quantize import auto_mode, batch_drift

WIDTH, HIDDEN, VOCAB = 32, 64, 2048


def block(path: Path, opset: int) -> Path:
    """Token ids -> an embedding lookup, LayerNorm, a feed-forward pair of MatMuls with a skewed activation and a
    residual: the shape of a BERT layer, with an outlier channel as BERT's LayerNorms have."""
    rng = np.random.default_rng(0)
    gamma = np.ones(WIDTH, np.float32)
    gamma[3] = 12.0  # the outlier channel SmoothQuant is for
    inits = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, WIDTH)).astype(np.float32), "table"),
        numpy_helper.from_array(gamma, "gamma"),
        numpy_helper.from_array(np.zeros(WIDTH, np.float32), "beta"),
        numpy_helper.from_array((rng.standard_normal((WIDTH, HIDDEN)) * 0.2).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal(HIDDEN) * 0.1).astype(np.float32), "b1"),
        numpy_helper.from_array((rng.standard_normal((HIDDEN, WIDTH)) * 0.2).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"]),
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1),
        helper.make_node("MatMul", ["n", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Sigmoid", ["h1"], ["g"]),
        helper.make_node("Mul", ["h1", "g"], ["h"]),  # SiLU: nearly all positive, as GELU's outputs are
        helper.make_node("MatMul", ["h", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "n"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "tokens", WIDTH])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def rows(n: int = 48, tokens: int = 12, seed: int = 1) -> DataFile:
    ids = np.random.default_rng(seed).integers(0, VOCAB, (n, tokens))
    ids[n // 2 :, tokens // 2 :] = 0  # rows with padding beside full ones
    return DataFile({"ids": ids.astype(np.int64)}, None)


def run(path: Path, data: DataFile) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, data.inputs)[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMax's axes an attribute, then an input
def test_a_row_alone_and_in_any_batch_gives_the_same_answer(tmp_path: Path, opset: int) -> None:
    src = block(tmp_path / "block.onnx", opset)
    dst = tmp_path / "block.int8.onnx"
    quantize_per_token(src, dst, rows(seed=2))
    data = rows()
    together = run(dst, data)
    for row in range(0, data.rows, 7):
        alone = run(dst, DataFile({"ids": data.inputs["ids"][row : row + 1]}, None))
        np.testing.assert_array_equal(alone[0], together[row])
    float_out = run(src, data)
    error = np.linalg.norm(together - float_out) / np.linalg.norm(float_out)
    assert error < 0.02, error
    onnx.checker.check_model(onnx.load(str(dst)))  # a valid graph: no initializer named twice
    graph = onnx.load(str(dst)).graph
    ops = {node.op_type for node in graph.node}
    assert "MatMulIntegerToFloat" in ops and "DynamicQuantizeLinear" not in ops
    producers = {out: node for node in graph.node for out in node.output}
    floats = [producers[node.input[0]] for node in graph.node if node.op_type == "MatMul"]
    # The only float products left are the outlier channels' own, gathered out of each activation.
    assert floats and all(n.op_type == "Gather" and n.input[1].endswith("outliers") for n in floats), floats
    assert batch_drift(ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]), data) == 0


def test_calibration_brings_it_nearer_the_float_model(tmp_path: Path) -> None:
    src = block(tmp_path / "block.onnx", 17)
    data = rows()
    float_out = run(src, data)
    errors = []
    for calibration in (None, rows(seed=3)):
        dst = tmp_path / f"block-{calibration is None}.onnx"
        quantize_per_token(src, dst, calibration)
        errors.append(np.linalg.norm(run(dst, data) - float_out) / np.linalg.norm(float_out))
    assert errors[1] < errors[0], errors


def test_outlier_channels_multiplied_in_float_keep_the_answer_the_rows_alone(tmp_path: Path) -> None:
    """LLM.int8()'s decomposition: each activation's largest channels leave the int8 grid for a float product; the
    answer is still the row's alone and as near the float model (what it gains on MiniLM, where outliers outlast
    SmoothQuant, bench_quantization measures: here SmoothQuant already tames the block's one outlier)."""
    src = block(tmp_path / "block.onnx", 17)
    data, calibration = rows(), rows(seed=3)
    float_out = run(src, data)
    errors = []
    for outliers in (0, 2):
        dst = tmp_path / f"block-{outliers}.onnx"
        quantize_per_token(src, dst, calibration, outliers=outliers)
        together = run(dst, data)
        alone = run(dst, DataFile({"ids": data.inputs["ids"][5:6]}, None))
        np.testing.assert_array_equal(alone[0], together[5])
        errors.append(np.linalg.norm(together - float_out) / np.linalg.norm(float_out))
    assert errors[1] < 0.02 and abs(errors[1] - errors[0]) < 0.005, errors
    graph = onnx.load(str(tmp_path / "block-2.onnx")).graph
    onnx.checker.check_model(onnx.load(str(tmp_path / "block-2.onnx")))
    # One small float product, for the MatMul a LayerNorm feeds: the other's outliers stay on the int8 grid.
    assert sum(node.op_type == "MatMul" for node in graph.node) == 1
    picked = next(numpy_helper.to_array(i) for i in graph.initializer if i.name.endswith("outliers"))
    assert 3 in picked.tolist()  # the LayerNorm's outlier channel is among those the first group keeps in float


def test_the_command_chooses_per_token_for_a_transformer_and_reports_invariance(tmp_path: Path) -> None:
    src = block(tmp_path / "block.onnx", 17)
    assert auto_mode(src) == "per-token"
    validation = tmp_path / "val.npz"
    np.savez(validation, **rows().inputs)
    runner = CliRunner()
    args = ["quantize", str(src), "--validation", str(validation), "--rounds", "10", "--force"]
    chosen = runner.invoke(app, [*args, "-o", str(tmp_path / "pt.onnx")])
    assert chosen.exit_code == 0, chosen.output
    assert "mode              per-token" in chosen.output
    assert "batch-invariant   yes" in chosen.output, chosen.output
    dynamic = runner.invoke(app, [*args, "-o", str(tmp_path / "dyn.onnx"), "--mode", "dynamic", "--per-channel"])
    assert dynamic.exit_code == 0, dynamic.output
    assert "batch-invariant   no, a row's answer moves with its batch" in dynamic.output, dynamic.output
    alone = runner.invoke(app, ["quantize", str(src), "-o", str(tmp_path / "r.onnx"), "--rounds", "10", "--force"])
    assert "batch-invariant   not measured" in alone.output, alone.output  # one synthetic row: no batch to compare
    wrong = runner.invoke(app, [*args, "-o", str(tmp_path / "x.onnx"), "--mode", "fp8"])
    assert wrong.exit_code != 0 and "--mode must be auto, per-token, dynamic, static" in wrong.output


def test_every_pair_of_products_fits_the_int16_that_cpus_without_vnni_sum_into(tmp_path: Path) -> None:
    """On AVX2 without VNNI onnxruntime adds u8 × s8 products in pairs into a saturating int16: every quantized row
    the model makes, times its weights' largest value, twice, must fit it, or answers change with the CPU."""
    src = block(tmp_path / "block.onnx", 17)
    dst = tmp_path / "block.int8.onnx"
    quantize_per_token(src, dst, rows(seed=3))
    model = onnx.load(str(dst))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    matmuls = [node for node in model.graph.node if node.op_type == "MatMulIntegerToFloat"]
    rows_in = sorted({node.input[0] for node in matmuls})
    model.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.UINT8, None) for name in rows_in)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    data = rows(seed=4)
    quantized = dict(zip(rows_in, session.run(rows_in, data.inputs), strict=True))
    for node in matmuls:
        widest = int(np.abs(inits[node.input[1]].astype(np.int32)).max())
        assert 2 * int(quantized[node.input[0]].max()) * widest <= 32767, (node.name, widest)
