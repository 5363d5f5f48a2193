"""Quantize ONNX models with onnxruntime.quantization and report what it bought.

The report is honest by construction: latency is measured before and after on the same
inputs, interleaved so that machine noise hits both alike, and compared as medians. Whether
the quantized model is slower is a statistical decision, not a fixed margin: each round gives
a paired ratio (after / before, run back to back), and a bootstrap gives the 95% confidence
interval of their median. The model is "slower" only when the whole interval lies above
``1 + MIN_EFFECT``: confidently slower, and by more than a difference nobody would notice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from fnserve.core.codec.datafiles import DataFile

Mode = Literal["per-token", "dynamic", "static"]
MODES: tuple[Mode, ...] = ("per-token", "dynamic", "static")
# The smallest slow-down worth refusing a model for (2%), once it is statistically certain.
MIN_EFFECT = 0.02
# A row alone and in a batch that differ by no more than this are the same answer (float sums in another order).
INVARIANT_ATOL = 1e-5
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Latency:
    """Median latency of one batch size, before and after, in milliseconds; with the paired rounds'
    median after/before ratio and its confidence interval (``ratio_low``, ``ratio_high``) when measured."""

    batch: int
    before_ms: float
    after_ms: float
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    rounds: int = 0

    @property
    def speedup(self) -> float:
        return self.before_ms / self.after_ms

    @property
    def slower(self) -> bool:
        """Confidently slower by more than MIN_EFFECT (without an interval: the medians say so)."""
        low = self.ratio_low if self.ratio_low is not None else self.after_ms / self.before_ms
        return low > 1 + MIN_EFFECT

    def line(self) -> str:
        """This batch size's report line: the medians before and after, and the verdict."""
        return (
            f"latency batch {self.batch:<3} {self.before_ms:.3f} ms -> {self.after_ms:.3f} ms "
            f"({self.speedup:.2f}x speed-up, medians): {self.verdict()}"
        )

    def verdict(self) -> str:
        """The decision and its basis, in words."""
        if self.ratio is None or self.ratio_low is None or self.ratio_high is None:
            return "slower" if self.slower else "not slower"
        basis = (
            f"after/before {self.ratio:.3f}, {CONFIDENCE:.0%} CI {self.ratio_low:.3f}-{self.ratio_high:.3f} "
            f"over {self.rounds} paired rounds"
        )
        if self.slower:
            return f"slower ({basis}: above {1 + MIN_EFFECT:.2f} throughout)"
        if self.ratio_high < 1:
            return f"faster ({basis})"
        return f"not slower ({basis}: within {MIN_EFFECT:.0%} or inconclusive)"


def paired_ratio_interval(before_s: list[float], after_s: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Median of the paired after/before ratios and its bootstrap confidence interval."""
    ratios = np.asarray(after_s) / np.asarray(before_s)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ratios), size=(BOOTSTRAP_RESAMPLES, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return float(np.median(ratios)), float(low), float(high)


@dataclass
class QuantizeReport:
    """Everything the quantize command prints."""

    mode: str
    size_before: int
    size_after: int
    latencies: list[Latency] = field(default_factory=list)
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    agreement: dict[str, str] = field(default_factory=dict)
    unquantized_ops: list[str] | None = None  # set when nothing was quantized: the graph's operators
    # Largest difference of a row's outputs alone and in a batch, before and after (None: not measured).
    batch_drift: tuple[float, float] | None = None
    drift_rows: int = 0
    drift_batch: int = 0

    def slower_at(self) -> list[int]:
        """Batch sizes at which the quantized model is confidently slower (see :attr:`Latency.slower`)."""
        return [lat.batch for lat in self.latencies if lat.slower]

    def lines(self) -> list[str]:
        """The report as aligned text lines."""
        out = [
            f"mode              {self.mode}",
            f"size              {self.size_before / 1024:.1f} KiB -> {self.size_after / 1024:.1f} KiB "
            f"({self.size_after / self.size_before:.2f}x)",
        ]
        out += [lat.line() for lat in self.latencies]
        if self.accuracy_before is not None and self.accuracy_after is not None:
            out.append(f"accuracy          {self.accuracy_before:.4f} -> {self.accuracy_after:.4f}")
        for name, text in self.agreement.items():
            out.append(f"output {name}: {text}")
        if self.batch_drift is not None:
            before, after = self.batch_drift
            basis = (
                f"{self.drift_rows} rows alone and in a batch of {self.drift_batch}: "
                f"max abs diff {before:.3g} before, {after:.3g} after"
            )
            verdict = "yes" if after <= INVARIANT_ATOL else "no, a row's answer moves with its batch"
            out.append(f"batch-invariant   {verdict} ({basis})")
        else:
            out.append("batch-invariant   not measured: it takes more than one row of --validation or --calibration")
        if self.unquantized_ops is not None:
            out.append(
                f"nothing quantized: none of this graph's operators ({', '.join(self.unquantized_ops)}) is one "
                "onnxruntime quantizes (MatMul, Gemm, Conv, Gather, ...); the output computes what the input does"
            )
        return out


class _NpzReader:
    """onnxruntime CalibrationDataReader over a DataFile, in batches."""

    def __init__(self, data: DataFile, batch: int = 16) -> None:
        self._iter = self._batches(data, batch)

    @staticmethod
    def _batches(data: DataFile, batch: int) -> Iterator[dict[str, np.ndarray[Any, Any]]]:
        for start in range(0, data.rows, batch):
            yield {k: v[start : start + batch] for k, v in data.inputs.items()}

    def get_next(self) -> dict[str, np.ndarray[Any, Any]] | None:
        return next(self._iter, None)


def quantize(
    src: Path,
    dst: Path,
    *,
    mode: Mode = "dynamic",
    per_channel: bool = False,
    calibration: DataFile | None = None,
) -> None:
    """Write the quantized form of ``src`` to ``dst`` (static mode needs calibration data; per-token uses it)."""
    if mode == "per-token":
        from fnserve.per_token import quantize_per_token

        quantize_per_token(src, dst, calibration)
        return
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src, dst = src.resolve(), dst.resolve()
    with tempfile.TemporaryDirectory() as tmp, _quiet_root_logger():
        src = _one_opset_per_domain(src, Path(tmp) / "source.onnx")
        prepared = Path(tmp) / "prepared.onnx"
        try:
            # In the temporary directory: ORT's symbolic shape inference drops a copy of the model
            # into the working directory when it gives up.
            with contextlib.chdir(tmp):
                quant_pre_process(str(src), str(prepared), skip_symbolic_shape=False)
        except Exception:  # pre-processing is an optimisation; some graphs refuse it
            prepared = src
        if mode == "dynamic":
            quantize_dynamic(prepared, dst, per_channel=per_channel, weight_type=QuantType.QInt8)
        else:
            if calibration is None:
                raise ValueError("static quantization needs calibration data")
            quantize_static(
                prepared,
                dst,
                _NpzReader(calibration),
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
            )


# Operators only a quantized graph has: integer kernels, and the (de)quantizing nodes around them.
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearMatMul",
        "QLinearConv",
        "DynamicQuantizeMatMul",
        "QGemm",
        "QAttention",
        "QEmbedLayerNormalization",
    }
)


def unquantized_ops(path: Path) -> list[str] | None:
    """The operators of the model at ``path`` when none of them is a quantized one (None when some are)."""
    import onnx

    ops = [node.op_type for node in onnx.load(str(path)).graph.node]
    return None if QUANTIZED_OPS.intersection(ops) else sorted(set(ops))


def _one_opset_per_domain(src: Path, scratch: Path) -> Path:
    """``src``, or a copy of it at ``scratch`` whose opset imports name each domain once (the highest version).

    skl2onnx lists the default domain twice (every scikit-learn linear model: digits-fast, wine, breast
    cancer), and onnxruntime's quantizer then fails with "Failed to find proper ai.onnx domain"."""
    import onnx

    model = onnx.load(str(src))
    versions: dict[str, int] = {}
    for opset in model.opset_import:
        versions[opset.domain] = max(opset.version, versions.get(opset.domain, 0))
    if len(versions) == len(model.opset_import):
        return src
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in versions.items())
    onnx.save(model, str(scratch))
    return scratch


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime's quantizer warns on the root logger ("Please consider to run pre-processing"), which
    fnserve runs itself: not a line for the user."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    """A CPU session on ``path`` with ``threads`` intra-op threads (default: all CPUs)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def measure_latency(
    before: ort.InferenceSession,
    after: ort.InferenceSession,
    sample: DataFile,
    batch: int,
    rounds: int,
    tick: Callable[[], None] | None = None,
) -> Latency:
    """Interleaved median latency of both sessions on the same ``batch`` rows."""
    feed = {k: _rows(v, batch) for k, v in sample.inputs.items()}
    sessions = (before, after)
    for sess in sessions:  # warm-up: first runs allocate
        for _ in range(3):
            sess.run(None, feed)
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        # Alternate which goes first so neither always runs on a cache warmed by the other.
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            sessions[which].run(None, feed)
            samples[which].append(time.perf_counter() - t0)
        if tick:
            tick()
    ratio, low, high = paired_ratio_interval(samples[0], samples[1])
    return Latency(
        batch,
        statistics.median(samples[0]) * 1e3,
        statistics.median(samples[1]) * 1e3,
        ratio,
        low,
        high,
        rounds,
    )


def compare_outputs(
    before: ort.InferenceSession,
    after: ort.InferenceSession,
    data: DataFile,
    report: QuantizeReport,
) -> None:
    """Fill the report's accuracy (when labels exist) and per-output agreement."""
    out_before = before.run(None, data.inputs)
    out_after = after.run(None, data.inputs)
    for meta, a, b in zip(before.get_outputs(), out_before, out_after, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "iub":
            report.agreement[meta.name] = f"{np.mean(a == b):.2%} identical"
        elif a.dtype.kind == "f":
            text = f"max abs diff {float(np.max(np.abs(a - b))):.3g}"
            if a.ndim == 2:
                text += f", top-1 agreement {np.mean(a.argmax(1) == b.argmax(1)):.2%}"
            report.agreement[meta.name] = text
    if data.labels is not None:
        report.accuracy_before = _accuracy(out_before, data.labels)
        report.accuracy_after = _accuracy(out_after, data.labels)


def batch_drift(sess: ort.InferenceSession, data: DataFile, rows: int = 8, batch: int = 64) -> float:
    """Largest difference between a row's outputs run alone and run in a batch of ``data``'s first rows (inf
    where an integer output differs): 0 for a model whose every row depends on that row alone."""
    feed = {k: v[:batch] for k, v in data.inputs.items()}
    together = sess.run(None, feed)
    worst = 0.0
    for row in range(min(rows, data.rows)):
        alone = sess.run(None, {k: v[row : row + 1] for k, v in feed.items()})
        for a, b in zip(alone, together, strict=True):
            a, b = np.asarray(a), np.asarray(b)[row : row + 1]
            if a.dtype.kind == "f":
                worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)))
            elif a.dtype.kind in "iub" and not np.array_equal(a, b):
                worst = float("inf")
    return worst


def _accuracy(outputs: list[Any], labels: np.ndarray[Any, Any]) -> float | None:
    # A classifier's label output (integers, one per row) if it has one, else argmax of scores.
    for out in outputs:
        out = np.asarray(out)
        if out.dtype.kind in "iu" and out.shape == labels.shape:
            return float(np.mean(out == labels))
    for out in outputs:
        out = np.asarray(out)
        if out.dtype.kind == "f" and out.ndim == 2 and out.shape[0] == labels.shape[0]:
            return float(np.mean(out.argmax(1) == labels))
    return None


def _rows(array: np.ndarray[Any, Any], n: int) -> np.ndarray[Any, Any]:
    reps = -(-n // array.shape[0])
    return np.ascontiguousarray(np.concatenate([array] * reps)[:n]) if reps > 1 else array[:n].copy()


def synthetic_inputs(sess: ort.InferenceSession, seed: int = 0) -> DataFile:
    """Random inputs shaped like the model's (variable dimensions set to 1), for timing only."""
    from fnserve.core.models.datatypes import ORT_TO_V2, V2_TO_NUMPY

    rng = np.random.default_rng(seed)
    inputs = {}
    for arg in sess.get_inputs():
        dtype = V2_TO_NUMPY[ORT_TO_V2[arg.type]]
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]
        inputs[arg.name] = rng.standard_normal(shape).astype(dtype)
    return DataFile(inputs, None)


def file_size(path: Path) -> int:
    return os.stat(path).st_size


def auto_mode(path: Path) -> Mode:
    """per-token for a transformer (its rows must not move with their batch-mates), dynamic otherwise."""
    import onnx

    from fnserve.per_token import applies

    return "per-token" if applies(onnx.load(str(path), load_external_data=False)) else "dynamic"
