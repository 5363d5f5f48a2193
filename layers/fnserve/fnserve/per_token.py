"""Per-token int8 quantization: each row's activations quantized by that row's own range.

onnxruntime's dynamic quantization takes one activation scale from the whole batch tensor, padding included, so a
text's numbers move with whatever it was batched with. Here every weight MatMul becomes onnxruntime's
``MatMulIntegerToFloat`` fed by a ``QuantizeLinear`` along the rows, whose scale is each row's (each token's) own
minimum and maximum: a row's answer depends on that row alone, whatever its batch, its padding or the path it took.

What keeps it near the float model, each step measured on docs/design/quantization.md:

- weights per output column in 8 bits (±127), a row's activations in 7 (0 to 127): x86 CPUs without VNNI multiply
  u8 × s8 pairs into a saturating int16, which 8 bits on both sides overflow. With one side at 7 bits every sum is
  exact on every CPU, so a row's answer is also the same on every machine; the bit is the activations' to give,
  since a row's own range already fits its grid to it, while a weight column's serves every token. GPTQ's rounding
  (each column's error pushed onto the columns after it, weighed by the calibration activations) does the rest;
- a zero point a MatMul keeps for all rows, from the calibration rows' range (GELU's outputs are nearly all
  positive): the scale still comes from each row alone;
- SmoothQuant on the MatMuls a LayerNormalization feeds: each channel divided by a factor its weights' rows take
  on, so a few outlier channels no longer set every token's scale;
- embedding tables quantized a row at a time and dequantized after the lookup, so the table stays int8 in memory;
- with calibration, LLM.int8()'s decomposition (``outliers``): the few largest channels of what a LayerNorm feeds,
  found on the calibration rows, multiplied in float and left out of the row's range, so that they no longer
  coarsen the grid of every other channel of the token.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

    from fnserve.core.codec.datafiles import DataFile

WEIGHT_LEVELS = 127  # 8-bit weights beside 7-bit rows: every pair of products fits an int16 (see the docstring)
ACTIVATION_LEVELS = 127
OUTLIERS = 8  # channels an activation keeps in float: the few that set most tokens' ranges, at little CPU
SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength: the activations' and the weights' ranges met halfway
GPTQ_DAMP = 0.01  # of the Hessian's mean diagonal, so that a channel the calibration never lit stays invertible
EMBEDDING_ROWS = 1024  # Gather tables with at least this many rows are stored int8 (vocabularies, not positions)
CALIBRATION_BATCH = 16
_TINY = np.float32(1e-12)
_NORMS = frozenset({"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization"})


def applies(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is a transformer (a LayerNormalization beside MatMuls with constant weights)."""
    from onnx import TensorProto

    ops = {node.op_type for node in model.graph.node}
    shapes = {i.name: (len(i.dims), i.data_type) for i in model.graph.initializer}  # no weights read: dims alone
    weights = any(
        node.op_type == "MatMul" and shapes.get(node.input[1]) == (2, TensorProto.FLOAT) for node in model.graph.node
    )
    return bool(ops & _NORMS) and weights


@dataclass
class _Group:
    """The weight MatMuls that read one activation, quantized once for all of them."""

    activation: str
    matmuls: list[tuple[int, onnx.NodeProto, np.ndarray[Any, Any]]]  # each one's place in the graph
    after_norm: bool
    smooth: np.ndarray[Any, Any] | None = None  # a factor per channel, where SmoothQuant applies
    zero_point: int = (ACTIVATION_LEVELS + 1) // 2
    hessian: np.ndarray[Any, Any] | None = None  # X^T X of the (smoothed) calibration activations
    channel_max: np.ndarray[Any, Any] | None = None
    ranges: list[np.ndarray[Any, Any]] = field(default_factory=list)  # each calibration row's share below zero


def quantize_per_token(src: Path, dst: Path, calibration: DataFile | None = None, outliers: int = OUTLIERS) -> None:
    """Write ``src`` with every weight MatMul quantized per token (and its embedding tables per row) to ``dst``.

    With ``calibration`` (rows of the model's inputs), zero points, SmoothQuant and GPTQ come from it; without,
    rows are quantized symmetrically and weights rounded to nearest. ``outliers``: the channels of each activation
    (the calibration's largest) multiplied in float beside the int8 product; 0, none; none without calibration."""
    import onnx

    model = onnx.load(str(src))
    opset = _opset(model)
    if opset < 13:
        raise ValueError(
            f"per-token quantization needs opset 13 or later (QuantizeLinear along an axis); {src} is {opset}"
        )
    groups = _groups(model)
    if calibration is not None:
        _calibrate(model, groups, calibration)
    _rewrite(model, groups, opset, outliers if calibration is not None else 0)
    onnx.save(model, str(dst))


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {init.name: init for init in model.graph.initializer}


def _weight_matmuls(model: onnx.ModelProto) -> list[tuple[int, onnx.NodeProto, np.ndarray[Any, Any]]]:
    from onnx import numpy_helper

    inits = _initializers(model)
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "MatMul" and node.input[1] in inits:
            weight = numpy_helper.to_array(inits[node.input[1]])
            if weight.ndim == 2 and weight.dtype == np.float32:
                found.append((index, node, weight))
    return found


def _groups(model: onnx.ModelProto) -> list[_Group]:
    producers = {out: node for node in model.graph.node for out in node.output}
    by_activation: dict[str, list[tuple[int, onnx.NodeProto, np.ndarray[Any, Any]]]] = defaultdict(list)
    for found in _weight_matmuls(model):
        by_activation[found[1].input[0]].append(found)
    groups = []
    for activation, matmuls in by_activation.items():
        producer = producers.get(activation)
        groups.append(_Group(activation, matmuls, producer is not None and producer.op_type in _NORMS))
    return groups


def _calibrate(model: onnx.ModelProto, groups: list[_Group], data: DataFile) -> None:
    """Each group's channel maxima, rows' ranges and X^T X over the calibration rows, then its smoothing."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    wanted = [g.activation for g in groups]
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in wanted if name not in known
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as it is rewritten
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for feed in _batches(data):
        for group, value in zip(groups, session.run(wanted, feed), strict=True):
            rows = value.reshape(-1, value.shape[-1]).astype(np.float64)
            peak = np.abs(rows).max(axis=0)
            group.channel_max = peak if group.channel_max is None else np.maximum(group.channel_max, peak)
            low, high = np.minimum(rows.min(axis=1), 0), np.maximum(rows.max(axis=1), 0)
            group.ranges.append(-low / np.maximum(high - low, 1e-12))
            gram = rows.T @ rows
            group.hessian = gram if group.hessian is None else group.hessian + gram
    for group in groups:
        assert group.channel_max is not None and group.hessian is not None
        share = float(np.median(np.concatenate(group.ranges)))
        group.zero_point = int(np.clip(np.round(ACTIVATION_LEVELS * share), 1, ACTIVATION_LEVELS - 1))
        if group.after_norm:
            weight_max = np.max([np.abs(w).max(axis=1) for _, _, w in group.matmuls], axis=0)
            factor = group.channel_max**SMOOTH_ALPHA / np.maximum(weight_max, 1e-8) ** (1 - SMOOTH_ALPHA)
            group.smooth = np.clip(factor, 1e-4, 1e4).astype(np.float32)
            inverse = 1 / group.smooth.astype(np.float64)
            group.hessian = group.hessian * inverse[:, None] * inverse[None, :]


def _batches(data: DataFile) -> Iterator[dict[str, np.ndarray[Any, Any]]]:
    for start in range(0, data.rows, CALIBRATION_BATCH):
        yield {name: value[start : start + CALIBRATION_BATCH] for name, value in data.inputs.items()}


def _quantize_weight(weight: np.ndarray[Any, Any], hessian: np.ndarray[Any, Any] | None) -> tuple[Any, Any]:
    """int8 values in ±WEIGHT_LEVELS and a scale per output column; GPTQ's rounding where a Hessian is known."""
    scale = (np.maximum(np.abs(weight).max(axis=0), 1e-12) / WEIGHT_LEVELS).astype(np.float32)
    if hessian is None:
        return np.clip(np.round(weight / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8), scale
    h = hessian + GPTQ_DAMP * float(np.mean(np.diag(hessian))) * np.eye(hessian.shape[0])
    upper = np.linalg.cholesky(np.linalg.inv(h)).T
    rest = weight.astype(np.float64)
    values = np.empty(weight.shape, np.int8)
    for k in range(weight.shape[0]):
        q = np.clip(np.round(rest[k] / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS)
        values[k] = q
        error = (rest[k] - q * scale) / upper[k, k]
        rest[k + 1 :] -= np.outer(upper[k, k + 1 :], error)
    return values, scale


class _Writer:
    """New nodes and initializers, named under one prefix so they never meet the model's own."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.initializers: list[onnx.TensorProto] = []
        self.taken = {i.name for i in model.graph.initializer} | {o for n in model.graph.node for o in n.output}

    def const(self, name: str, value: np.ndarray[Any, Any] | np.generic) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def prefix(self, index: int) -> str:
        base = f"per_token/{index}/"
        while any(t.startswith(base) for t in self.taken):
            base = "_" + base
        return base


def _reduce(op: str, source: str, out: str, axes: str | None) -> onnx.NodeProto:
    """``op`` over the last axis: named by the initializer ``axes`` from opset 18, by an attribute before."""
    from onnx import helper

    if axes is not None:
        return helper.make_node(op, [source, axes], [out], keepdims=1)
    return helper.make_node(op, [source], [out], axes=[-1], keepdims=1)


def _rewrite(model: onnx.ModelProto, groups: list[_Group], opset: int, outliers: int = 0) -> None:
    from onnx import helper

    writer = _Writer(model)
    placed: dict[int, list[onnx.NodeProto]] = {}
    for index, group in enumerate(groups):
        p = writer.prefix(index)
        zp = group.zero_point
        source = group.activation
        nodes = []
        weights = group.matmuls
        apart = _outlier_channels(group, outliers)
        if group.smooth is not None:
            # The outliers go to a float product of their own: zero in the int8 one, by the smoothing's own Mul.
            unsmooth = (1 / group.smooth).astype(np.float32)
            unsmooth[apart] = 0
            nodes.append(helper.make_node("Mul", [source, writer.const(p + "unsmooth", unsmooth)], [p + "x"]))
            if apart.size:
                nodes.append(
                    helper.make_node("Gather", [source, writer.const(p + "outliers", apart)], [p + "xo"], axis=-1)
                )
            source = p + "x"
            weights = [(i, node, _without(w * group.smooth[:, None], apart)) for i, node, w in weights]
        channels = weights[0][2].shape[0]
        axes = writer.const(p + "axes", np.array([-1], np.int64)) if opset >= 18 else None  # one for both reduces
        up = writer.const(p + "up", np.float32(1 / (ACTIVATION_LEVELS - zp)))
        nodes += [
            _reduce("ReduceMax", source, p + "max", axes),
            _reduce("ReduceMin", source, p + "min", axes),
            helper.make_node("Mul", [p + "max", up], [p + "s_up"]),
            helper.make_node("Mul", [p + "min", writer.const(p + "down", np.float32(-1 / zp))], [p + "s_down"]),
            helper.make_node("Max", [p + "s_up", p + "s_down", writer.const(p + "tiny", _TINY)], [p + "scale"]),
            # QuantizeLinear takes a scale along one axis: the rows, once the activation is a matrix.
            helper.make_node("Reshape", [p + "scale", writer.const(p + "flat", np.array([-1], np.int64))], [p + "s1"]),
            helper.make_node("Shape", [p + "s1"], [p + "rows"]),
            helper.make_node("Expand", [writer.const(p + "zp", np.uint8(zp)), p + "rows"], [p + "zp1"]),
            helper.make_node(
                "Reshape", [source, writer.const(p + "matrix", np.array([-1, channels], np.int64))], [p + "x2"]
            ),
            helper.make_node("QuantizeLinear", [p + "x2", p + "s1", p + "zp1"], [p + "q2"], axis=0),
            helper.make_node("Shape", [source], [p + "shape"]),
            helper.make_node("Reshape", [p + "q2", p + "shape"], [p + "q"]),
        ]
        for j, (place, node, weight) in enumerate(weights):
            values, scale = _quantize_weight(weight, group.hessian)
            inputs = [
                p + "q",
                writer.const(f"{p}w{j}", values),
                p + "scale",  # a scale a row: onnxruntime multiplies the output by it
                writer.const(f"{p}w{j}_scale", scale),
                p + "zp",
                writer.const(f"{p}w{j}_zp", np.zeros(weight.shape[1], np.int8)),
            ]
            # The bias stays its own Add: with a scale a row, onnxruntime would scale a fused bias too.
            product = f"{p}int8_{j}" if apart.size else node.output[0]
            matmul = helper.make_node(
                "MatMulIntegerToFloat",
                inputs,
                [product],
                name=f"{node.name or node.output[0]}/per_token",
                domain="com.microsoft",
            )
            placed[place] = [matmul]
            if apart.size:
                original = group.matmuls[j][2]  # the outliers are gathered before smoothing
                rows = writer.const(f"{p}w{j}_outliers", np.ascontiguousarray(original[apart]).astype(np.float32))
                placed[place] += [
                    helper.make_node("MatMul", [p + "xo", rows], [f"{p}float_{j}"]),
                    helper.make_node("Add", [product, f"{p}float_{j}"], [node.output[0]]),
                ]
        first = group.matmuls[0][0]  # the earliest reader: the activation exists there, and is quantized there
        placed[first] = nodes + placed[first]
    embeddings = _quantize_embeddings(model, writer)
    graph = model.graph
    rewritten: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        rewritten += embeddings.get(index) or placed.get(index) or [node]
    del graph.node[:]
    graph.node.extend(rewritten)
    used = {name for node in graph.node for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + writer.initializers)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _without(weight: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``weight`` with ``rows`` zeroed: the float product multiplies them, and left in they would widen every
    column's scale."""
    weight = weight.copy()
    weight[rows] = 0
    return weight


def _outlier_channels(group: _Group, count: int) -> np.ndarray[Any, Any]:
    """The ``count`` channels of the group's smoothed activation with the largest calibration magnitude, as int64
    indices; none without calibration, and none where nothing is smoothed (what a LayerNorm does not feed: its
    outliers moved the worst texts least, and each would cost a pass of its own to take out)."""
    if count <= 0 or group.channel_max is None or group.smooth is None:
        return np.zeros(0, np.int64)
    peak = group.channel_max / group.smooth
    return np.sort(np.argsort(-peak, kind="stable")[:count]).astype(np.int64)


def _quantize_embeddings(model: onnx.ModelProto, writer: _Writer) -> dict[int, list[onnx.NodeProto]]:
    """Gathers of a large float table: int8 rows and a scale a row, gathered both, dequantized after."""
    from onnx import TensorProto, helper, numpy_helper

    inits = _initializers(model)
    out: dict[int, list[onnx.NodeProto]] = {}
    for index, node in enumerate(model.graph.node):
        if node.op_type != "Gather" or node.input[0] not in inits:
            continue
        table = numpy_helper.to_array(inits[node.input[0]])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if table.ndim != 2 or table.dtype != np.float32 or table.shape[0] < EMBEDDING_ROWS or axis != 0:
            continue
        p = writer.prefix(len(model.graph.node) + index)
        scale = (np.maximum(np.abs(table).max(axis=1), 1e-12) / 127).astype(np.float32)
        values = np.clip(np.round(table / scale[:, None]), -127, 127).astype(np.int8)
        ids = node.input[1]
        out[index] = [
            helper.make_node("Gather", [writer.const(p + "table", values), ids], [p + "rows"], axis=0),
            helper.make_node("Gather", [writer.const(p + "scales", scale[:, None]), ids], [p + "scale"], axis=0),
            helper.make_node("Cast", [p + "rows"], [p + "float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [p + "float", p + "scale"], [node.output[0]]),
        ]
    return out
