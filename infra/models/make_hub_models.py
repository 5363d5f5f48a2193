"""Write tiny random-initialised Hugging Face models laid out as the Hub lays them out, with reference outputs.

Four folders under OUT_DIR, each as ``save_pretrained`` / sentence-transformers ``save`` writes it:

- ``bert-cls-query/``: a sentence-transformers embedder (BERT, CLS pooling, normalised) with a bge-style
  ``query`` prompt and no default prompt; no ONNX file.
- ``xlmr-mean-e5/``: a sentence-transformers embedder (XLM-RoBERTa with a Unigram tokenizer, mean pooling,
  normalised) with e5-style ``query``/``passage`` prompts, ``passage`` by default, and an optimum export in
  ``onnx/model.onnx``.
- ``cross-encoder/``: a BERT reranker with one label, saved by sentence-transformers' CrossEncoder.
- ``distilbert-3labels/``: a DistilBERT text classifier with labels negative/neutral/positive.

Each folder also holds ``reference.npz`` (not a Hub file): the outputs of sentence-transformers /
transformers in PyTorch float32 on the first sentences of ``--sentences``, computed from the folder as
loaded back from disk. Nothing is downloaded: configs and tokenizers are built here. Run it in the export
environment (``make .venv-export/.installed``):

    python infra/models/make_hub_models.py OUT_DIR --sentences tests/data/sentences.txt
"""

from __future__ import annotations

import os

# Before any Hugging Face import: they read these once, and nothing here may reach the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from optimum.exporters.onnx import main_export
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram
from tokenizers.trainers import UnigramTrainer
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    DistilBertTokenizerFast,
    PreTrainedTokenizerFast,
    XLMRobertaConfig,
    XLMRobertaModel,
    XLMRobertaTokenizerFast,
)

REPO = Path(__file__).resolve().parents[2]
WORDPIECE = REPO / "layers/models/models/minilm-l6/tokenizer.json"

MAX_TOKENS = 128
HIDDEN = 64
LAYERS = 2
HEADS = 4
INTERMEDIATE = 128
# Wider than transformers' default: with that a random encoder maps every text to nearly the same vector, and a
# test could not tell a right pooling or prompt from a wrong one.
INIT_RANGE = 0.2
# Scales the random classification heads so that scores and label order differ clearly across texts.
HEAD_STD = 0.3
# An upper bound: on a corpus of a few hundred lines the trainer stops at fewer pieces.
UNIGRAM_VOCAB = 2000
N_TEXTS = 24
QUERY_WORDS = 8
DOC_SHIFT = 5

BGE_PROMPTS = {"query": "Represent this sentence for searching relevant passages: "}
E5_PROMPTS = {"query": "query: ", "passage": "passage: "}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def bert_tokenizer(cls: type[PreTrainedTokenizerFast] = BertTokenizerFast) -> PreTrainedTokenizerFast:
    """The uncased WordPiece tokenizer of all-MiniLM-L6-v2, as a transformers fast tokenizer."""
    return cls(tokenizer_object=Tokenizer.from_file(str(WORDPIECE)), do_lower_case=True, model_max_length=MAX_TOKENS)


def xlmr_tokenizer(sentences: list[str]) -> XLMRobertaTokenizerFast:
    """A Unigram tokenizer trained on the sentences, with XLM-R's special tokens, ids and templates."""
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = UnigramTrainer(
        vocab_size=UNIGRAM_VOCAB - 1, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    scratch = Tokenizer(Unigram())
    scratch.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    scratch.train_from_iterator(sentences, trainer=trainer)
    # The trainer's scores vary in their last bits from run to run, and it hands out its lowest scores in
    # hash order: rounded, sorted, then made distinct again (a tie would leave segmentation to the
    # implementation), the vocabulary and its ids are the same every run.
    trained = [(piece, round(score, 3)) for piece, score in json.loads(scratch.to_str())["model"]["vocab"]]
    ranked = sorted((p for p in trained if p[0] not in specials), key=lambda p: (-p[1], p[0]))
    pieces = [(piece, round(score - 1e-6 * rank, 6)) for rank, (piece, score) in enumerate(ranked)]
    # XLM-R's ids: the four specials first, in this order, and <mask> last.
    tok = Tokenizer(Unigram([(s, 0.0) for s in specials] + pieces, unk_id=specials.index("<unk>")))
    # What XLM-R's tokenizer.json does, less its precompiled (nmt_nfkc) character map.
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )
    return XLMRobertaTokenizerFast(tokenizer_object=tok, model_max_length=MAX_TOKENS)


def bert_config(vocab_size: int, **extra: object) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=MAX_TOKENS,
        initializer_range=INIT_RANGE,
        **extra,
    )


def scale_head(head: torch.nn.Linear) -> None:
    with torch.no_grad():
        head.weight.normal_(0.0, HEAD_STD)
        head.bias.normal_(0.0, HEAD_STD)


def center_head(
    model: torch.nn.Module, head: torch.nn.Linear, tokenizer: PreTrainedTokenizerFast, corpus: list[str]
) -> None:
    """Zero the head's mean logit over the corpus: a random encoder shares most of its features across texts,
    which would otherwise give every text the same label."""
    model.eval()
    with torch.inference_mode():
        logits = model(**tokenizer(corpus, padding=True, truncation=True, return_tensors="pt")).logits
    with torch.no_grad():
        head.bias -= logits.mean(dim=0)


def save_embedder(
    out: Path,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    pooling: str,
    prompts: dict[str, str],
    default_prompt_name: str | None,
) -> None:
    """Save as sentence-transformers does: the transformer at the root, pooling and normalize after it."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        transformer = Transformer(tmp, max_seq_length=MAX_TOKENS)
        st = SentenceTransformer(
            modules=[transformer, Pooling(HIDDEN, pooling), Normalize()],
            prompts=prompts,
            default_prompt_name=default_prompt_name,
            device="cpu",
        )
        st.save(str(out))


def embedder_reference(out: Path, texts: list[str]) -> dict[str, np.ndarray]:
    st = SentenceTransformer(str(out), device="cpu", local_files_only=True)
    ref = {"texts": np.array(texts), "plain": st.encode(texts, convert_to_numpy=True)}
    for name in st.prompts:
        ref[f"prompt_{name}"] = st.encode(texts, prompt_name=name, convert_to_numpy=True)
    return {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in ref.items()}


def export_onnx(out: Path) -> None:
    """optimum's export into onnx/model.onnx, the file the Hub's sentence-transformers repos ship."""
    with tempfile.TemporaryDirectory() as tmp:
        # library "transformers": the bare encoder's last_hidden_state, as sentence-transformers' own ONNX
        # backend exports it (the sentence-transformers library would add its pooling to the graph).
        main_export(
            model_name_or_path=str(out),
            output=tmp,
            task="feature-extraction",
            library_name="transformers",
            local_files_only=True,
            device="cpu",
        )
        # Only the graph: optimum also copies config and tokenizer there, which Hub repos keep at the root.
        (out / "onnx").mkdir(exist_ok=True)
        shutil.move(str(Path(tmp) / "model.onnx"), out / "onnx" / "model.onnx")


def make_bert_cls_query(out: Path, texts: list[str]) -> None:
    torch.manual_seed(1)
    tokenizer = bert_tokenizer()
    model = BertModel(bert_config(len(tokenizer)))
    save_embedder(out, model, tokenizer, "cls", BGE_PROMPTS, None)
    np.savez(out / "reference.npz", **embedder_reference(out, texts))


def make_xlmr_mean_e5(out: Path, texts: list[str], corpus: list[str]) -> None:
    torch.manual_seed(2)
    tokenizer = xlmr_tokenizer(corpus)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        # RoBERTa's positions start after the padding id, so MAX_TOKENS tokens need two more, as in XLM-R.
        max_position_embeddings=MAX_TOKENS + 2,
        type_vocab_size=1,
        initializer_range=INIT_RANGE,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = XLMRobertaModel(config)
    save_embedder(out, model, tokenizer, "mean", E5_PROMPTS, "passage")
    export_onnx(out)
    ref = embedder_reference(out, texts)
    # Proves the ONNX file sits where sentence-transformers' ONNX backend looks for it, and matches.
    onnx_st = SentenceTransformer(str(out), device="cpu", local_files_only=True, backend="onnx")
    got = onnx_st.encode(texts, convert_to_numpy=True)
    if not np.allclose(got, ref["plain"], atol=1e-4):
        raise SystemExit(f"{out}: ONNX embeddings differ from PyTorch by {np.abs(got - ref['plain']).max()}")
    np.savez(out / "reference.npz", **ref)


def make_cross_encoder(out: Path, texts: list[str], sentences: list[str]) -> None:
    torch.manual_seed(3)
    tokenizer = bert_tokenizer()
    model = BertForSequenceClassification(bert_config(len(tokenizer), num_labels=1))
    scale_head(model.classifier)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # sentence-transformers v5 saves a CrossEncoder with its own modules.json and configs beside the
        # transformers files; that is what recent cross-encoder repos hold.
        CrossEncoder(tmp, device="cpu", local_files_only=True, max_length=MAX_TOKENS).save(str(out))

    queries = [" ".join(t.split()[:QUERY_WORDS]) for t in texts]
    half = len(texts) // 2
    documents = [sentences[i] if i < half else sentences[(i + DOC_SHIFT) % len(sentences)] for i in range(len(texts))]
    ce = CrossEncoder(str(out), device="cpu", local_files_only=True)
    scores = ce.predict(list(zip(queries, documents, strict=True)), convert_to_numpy=True)

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(out, local_files_only=True).eval()
    with torch.inference_mode():
        logits = hf(**tok(queries, documents, padding=True, truncation=True, return_tensors="pt")).logits
    np.savez(
        out / "reference.npz",
        queries=np.array(queries),
        documents=np.array(documents),
        scores=np.asarray(scores, dtype=np.float32),
        logits=logits.numpy().astype(np.float32),
    )


def make_distilbert_3labels(out: Path, texts: list[str], corpus: list[str]) -> None:
    torch.manual_seed(4)
    tokenizer = bert_tokenizer(DistilBertTokenizerFast)
    config = DistilBertConfig(
        vocab_size=len(tokenizer),
        dim=HIDDEN,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=INTERMEDIATE,
        max_position_embeddings=MAX_TOKENS,
        initializer_range=INIT_RANGE,
        num_labels=len(LABELS),
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )
    model = DistilBertForSequenceClassification(config)
    scale_head(model.classifier)
    center_head(model, model.classifier, tokenizer, corpus)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    hf = AutoModelForSequenceClassification.from_pretrained(out, local_files_only=True).eval()
    with torch.inference_mode():
        logits = hf(**tok(texts, padding=True, truncation=True, return_tensors="pt")).logits
    np.savez(
        out / "reference.npz",
        texts=np.array(texts),
        logits=logits.numpy().astype(np.float32),
        probabilities=torch.softmax(logits, dim=-1).numpy().astype(np.float32),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sentences", type=Path, required=True, help="one text per line")
    parser.add_argument("--only", action="append", default=[], help="make only this folder (repeatable)")
    args = parser.parse_args()

    sentences = [line.strip() for line in args.sentences.read_text(encoding="utf8").splitlines() if line.strip()]
    texts = sentences[:N_TEXTS]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    builders: dict[str, Callable[[Path], None]] = {
        "bert-cls-query": lambda out: make_bert_cls_query(out, texts),
        "xlmr-mean-e5": lambda out: make_xlmr_mean_e5(out, texts, sentences),
        "cross-encoder": lambda out: make_cross_encoder(out, texts, sentences),
        "distilbert-3labels": lambda out: make_distilbert_3labels(out, texts, sentences),
    }
    unknown = set(args.only) - set(builders)
    if unknown:
        parser.error(f"--only: no such folder {sorted(unknown)}; it makes {sorted(builders)}")
    for name, build in builders.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        out = args.out_dir / name
        # A stale file from an earlier run would be read as part of the repo.
        shutil.rmtree(out, ignore_errors=True)
        build(out)
        print(f"{out}: {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
