"""The ways to quantize the demo's MiniLM, side by side: batch invariance, accuracy against the float model's
sentence-transformers reference, and CPU a text.

    make minilm    (once: the fp32 export in .bench/minilm-encoder, and validation.npz beside it)
    python -m tests.bench.bench_quantization

- **The ways**: the fp32 export; onnxruntime's dynamic int8 (per-channel weights; one activation range a batch);
  the same run one text at a time; fnserve's per-token int8 (``fnserve quantize --mode per-token``, calibrated on
  validation.npz: 8-bit weights, 7-bit rows, 4 outlier channels in float), and beside it the same with no outlier
  channels, with 16 (``BENCH_QUANTIZATION_OUTLIERS``: the counts tried, 0 and 16), and with 7-bit weights beside
  8-bit rows (the other split that keeps every int16 pair sum exact); onnxruntime's static QDQ int8 (MinMax
  calibration on the same rows); weight-only 8-bit (``MatMulNBits``, block 32, int8 compute) where onnxruntime's
  quantizer imports (it needs ``onnx-ir``).
- **Invariance**: the largest difference of a text's embedding alone and beside others, over ``PROBES`` of the
  demo's sentences, each beside three short texts, beside a 256-token passage, and among all 242 in one request.
- **Accuracy**: cosine to ``tests/data/minilm-reference.npz`` of the 242 sentences served as one request (cut into
  runs by the demo model's token and attention budget), mean and worst.
- **CPU a text**: one single-threaded session each, the bench mix (``_minilm.mix``) run one text a run and
  cut by the budget (sorted by length), each way's runs of a round taken in turn; the median of ``ROUNDS`` rounds.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from fnserve.core.codec.datafiles import read_data
from fnserve.core.execution.embeddings import TokenBudget, token_runs
from fnserve.quantize import quantize
from tests.bench._minilm import mix
from tests.helpers import DEMO_MANIFEST, REPO

ROUNDS = int(os.environ.get("BENCH_QUANTIZATION_ROUNDS", "5"))
PROBES = 24
EXPORT = REPO / ".bench" / "minilm-encoder"
BUDGET = TokenBudget(1024, 32768)  # the demo's minilm-l6
MAX_ROWS = 64
OUTLIERS = [int(k) for k in os.environ.get("BENCH_QUANTIZATION_OUTLIERS", "0,16").split(",") if k]
DATA = REPO / "tests" / "data"

Feed = dict[str, np.ndarray[Any, Any]]


def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    return tok


TOKENIZER = tokenizer()


def feed(texts: Sequence[str]) -> Feed:
    encodings = TOKENIZER.encode_batch(list(texts))
    length = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), length), np.int64)
    mask = np.zeros_like(ids)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def embed(session: ort.InferenceSession, texts: Sequence[str]) -> np.ndarray[Any, Any]:
    f = feed(texts)
    tokens = session.run(None, f)[0]
    mask = f["attention_mask"][..., None].astype(np.float32)
    pooled = (tokens * mask).sum(1) / mask.sum(1)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)  # type: ignore[no-any-return]


def cut(texts: Sequence[str], budget: TokenBudget | None, max_rows: int = MAX_ROWS) -> list[list[str]]:
    count = {t: len(TOKENIZER.encode(t).ids) for t in texts}  # each text tokenized once
    ordered = sorted(texts, key=count.__getitem__)
    lengths = [count[t] for t in ordered]
    ends = token_runs(lengths, budget, max_rows)
    return [ordered[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def served(session: ort.InferenceSession, texts: Sequence[str], one_at_a_time: bool) -> np.ndarray[Any, Any]:
    """Each text's embedding as one request of them all gets it: cut into the budget's runs (or one a run)."""
    runs = [[t] for t in texts] if one_at_a_time else cut(texts, BUDGET)
    got = {text: row for run in runs for text, row in zip(run, embed(session, run), strict=True)}
    return np.stack([got[t] for t in texts])


def cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # type: ignore[no-any-return]


def drift(session: ort.InferenceSession, sentences: Sequence[str], one_at_a_time: bool) -> float:
    probes = sentences[:: len(sentences) // PROBES][:PROBES]
    alone = np.concatenate([embed(session, [t]) for t in probes])
    if one_at_a_time:
        return 0.0  # every text runs alone, whatever came with it
    passage = " ".join(sentences[:60])
    beside = [np.concatenate([embed(session, [t, "hi", "ok go", "yes"])[:1] for t in probes])]
    beside.append(np.concatenate([embed(session, [passage, t])[1:] for t in probes]))
    together = served(session, sentences, one_at_a_time=False)
    beside.append(together[[sentences.index(t) for t in probes]])
    return max(float(np.max(np.abs(b - alone))) for b in beside)


def build(directory: Path) -> dict[str, tuple[Path, bool]]:
    """Each way's model file, and whether it runs one text at a time."""
    fp32 = EXPORT / "model-fp32.onnx"
    validation = read_data(EXPORT / "validation.npz", ["input_ids", "attention_mask", "token_type_ids"])
    dynamic, per_token, static = directory / "dynamic.onnx", directory / "per-token.onnx", directory / "static.onnx"
    quantize(fp32, dynamic, mode="dynamic", per_channel=True)
    quantize(fp32, per_token, mode="per-token", calibration=validation)
    quantize(fp32, static, mode="static", per_channel=True, calibration=validation)
    from fnserve import per_token as rewrite
    from fnserve.per_token import quantize_per_token

    variants = {f"per-token int8, {k} outlier channels in float": directory / f"outliers-{k}.onnx" for k in OUTLIERS}
    for k, path in zip(OUTLIERS, variants.values(), strict=True):
        quantize_per_token(fp32, path, validation, outliers=k)
    split = "per-token int8, 7-bit weights beside 8-bit rows"
    variants[split] = directory / "seven-bit-weights.onnx"
    levels = rewrite.WEIGHT_LEVELS, rewrite.ACTIVATION_LEVELS
    rewrite.WEIGHT_LEVELS, rewrite.ACTIVATION_LEVELS = 63, 255
    try:
        quantize_per_token(fp32, variants[split], validation)
    finally:
        rewrite.WEIGHT_LEVELS, rewrite.ACTIVATION_LEVELS = levels
    ways = {
        "fp32": (fp32, False),
        "dynamic int8 (onnxruntime's; per-channel weights)": (dynamic, False),
        "dynamic int8, one text a run": (dynamic, True),
        "per-token int8 (fnserve's default)": (per_token, False),
        "static QDQ int8 (MinMax calibration)": (static, False),
        **{name: (path, False) for name, path in variants.items()},
    }
    try:
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        nbits = MatMulNBitsQuantizer(onnx.load(str(fp32)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
        nbits.process()
        nbits.model.save_model_to_file(str(directory / "nbits.onnx"), use_external_data_format=False)
        ways["8-bit weights only (MatMulNBits, block 32)"] = (directory / "nbits.onnx", False)
    except ImportError as exc:
        print(f"8-bit weights only: not run ({exc})")
    return ways


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def cpu_per_text(runs: Sequence[Feed], sess: ort.InferenceSession, count: int) -> float:
    began = time.process_time()
    for f in runs:
        sess.run(None, f)
    return (time.process_time() - began) / count * 1e3


def main() -> None:
    if not (EXPORT / "model-fp32.onnx").exists():
        raise SystemExit(f"no {EXPORT / 'model-fp32.onnx'}: run make minilm first")
    sentences = [line for line in (DATA / "sentences.txt").read_text().splitlines() if line]
    reference = np.load(DATA / "minilm-reference.npz")["embedding"]
    texts = mix()
    singles = [feed([t]) for t in texts]
    cuts = [feed(run) for run in cut(texts, BUDGET)]
    with tempfile.TemporaryDirectory() as tmp:
        ways = build(Path(tmp))
        sessions = {name: (session(path), alone) for name, (path, alone) in ways.items()}
        rows: dict[str, list[Any]] = {}
        for name, (sess, alone) in sessions.items():
            similarity = cosine(served(sess, sentences, alone), reference)
            rows[name] = [drift(sess, sentences, alone), similarity.mean(), similarity.min(), [], []]
        timed: list[Callable[[], None]] = []
        for name, (sess, alone) in sessions.items():

            def one_round(name: str = name, sess: ort.InferenceSession = sess, alone: bool = alone) -> None:
                rows[name][3].append(cpu_per_text(singles, sess, len(texts)))
                rows[name][4].append(rows[name][3][-1] if alone else cpu_per_text(cuts, sess, len(texts)))

            timed.append(one_round)
        for _ in range(ROUNDS):
            for run in timed:
                run()
    print(
        f"{len(texts)} texts of the bench mix, {len(cuts)} runs by the budget; {ROUNDS} rounds; ort {ort.__version__}"
    )
    print("| the way | max abs diff, alone vs batched | against fp32: mean, worst | CPU a text: batch 1 | best cut |")
    print("| --- | --- | --- | --- | --- |")
    for name, (diff, mean, worst, single, best) in rows.items():
        b1, bc = statistics.median(single), statistics.median(best)
        print(f"| {name} | {diff:.2g} | {mean:.4f}, {worst:.4f} | {b1:.2f} ms | {bc:.2f} ms |")


if __name__ == "__main__":
    main()
