"""What ``fnserve import`` reads from a Hugging Face folder, and the folders it refuses, file by file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fnserve.core.errors import ConfigError
from fnserve.hub.folder import read_folder

OLD_TYPES = "sentence_transformers.models."  # before sentence-transformers 5
NEW_TYPES = "sentence_transformers.base.modules."


def folder(tmp_path: Path, config: dict[str, Any], files: dict[str, Any] | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    for name, content in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    return tmp_path


def modules(prefix: str, *kinds: str) -> list[dict[str, str]]:
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    suffix = {"Transformer": "transformer.", "Pooling": "pooling.", "Normalize": "normalize.", "Dense": "dense."}
    return [{"path": paths[k], "type": prefix + (suffix[k] if prefix == NEW_TYPES else "") + k} for k in kinds]


BERT = {"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 512}


@pytest.mark.parametrize(
    ("prefix", "pooling", "mode"),
    [
        (OLD_TYPES, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
        (NEW_TYPES, {"pooling_mode": "lasttoken", "include_prompt": True}, "last_token"),
        (NEW_TYPES, {"pooling_mode": "max"}, "max"),
    ],
)
def test_pooling_and_normalize_are_read_in_either_format(
    tmp_path: Path, prefix: str, pooling: dict[str, Any], mode: str
) -> None:
    path = folder(tmp_path, BERT, {"modules.json": modules(prefix, "Transformer", "Pooling", "Normalize")})
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    found = read_folder(path)
    assert (found.kind, found.pooling, found.normalize) == ("embed", mode, True)


def test_a_plain_transformer_pools_as_sentence_transformers_makes_of_it(tmp_path: Path) -> None:
    found = read_folder(folder(tmp_path, BERT))
    assert (found.pooling, found.normalize, found.max_length) == ("mean", False, 512)
    assert any("no modules.json" in note for note in found.notes)


def test_the_length_is_what_sentence_transformers_cuts_to_within_the_positions(tmp_path: Path) -> None:
    xlmr = {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "max_position_embeddings": 514}
    assert read_folder(folder(tmp_path, xlmr, {"tokenizer_config.json": {"model_max_length": 1e30}})).max_length == 512
    bert = folder(tmp_path / "b", BERT, {"sentence_bert_config.json": {"max_seq_length": 256}})
    assert read_folder(bert).max_length == 256
    long = folder(tmp_path / "c", BERT, {"tokenizer_config.json": {"model_max_length": 8192}})
    assert read_folder(long).max_length == 512


def test_the_task_comes_from_the_architecture_and_its_labels(tmp_path: Path) -> None:
    rerank = {"architectures": ["XLMRobertaForSequenceClassification"], "num_labels": 1, "model_type": "xlm-roberta"}
    assert read_folder(folder(tmp_path / "r", rerank)).kind == "rerank"
    labels = {"0": "NEGATIVE", "1": "POSITIVE"}
    classify = {"architectures": ["DistilBertForSequenceClassification"], "id2label": labels, "model_type": "x"}
    found = read_folder(folder(tmp_path / "c", {**classify, "problem_type": "multi_label_classification"}))
    assert (found.kind, found.labels, found.multi_label) == ("classify", ["NEGATIVE", "POSITIVE"], True)
    identity = {"activation_fn": "torch.nn.modules.linear.Identity"}
    raw = read_folder(folder(tmp_path / "i", rerank, {"config_sentence_transformers.json": identity}))
    assert not raw.sigmoid


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {
                "modules.json": modules(OLD_TYPES, "Transformer", "Pooling", "Dense"),
                "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
            },
            "Dense (2_Dense) is not in",
        ),
        (
            {
                "modules.json": modules(OLD_TYPES, "Transformer", "Pooling"),
                "1_Pooling/config.json": {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True},
            },
            "pools by one mode (cls, mean, max, last token), the file asks for cls, max",
        ),
        (
            {
                "modules.json": modules(NEW_TYPES, "Transformer", "Pooling"),
                "1_Pooling/config.json": {"pooling_mode": "weightedmean"},
            },
            "asks for weightedmean",
        ),
        (
            {
                "modules.json": modules(NEW_TYPES, "Transformer", "Pooling"),
                "1_Pooling/config.json": {"pooling_mode": "mean", "include_prompt": False},
            },
            "include_prompt false",
        ),
        ({"config_sentence_transformers.json": {"prompts": {"q": "q: "}, "default_prompt_name": "p"}}, "'p' is no"),
    ],
)
def test_what_it_cannot_serve_is_refused_naming_the_file(tmp_path: Path, files: dict[str, Any], message: str) -> None:
    path = folder(tmp_path, BERT, files)
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_folder(path)


def test_a_folder_without_what_it_needs_says_which_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json is missing"):
        read_folder(tmp_path)
    path = folder(
        tmp_path, {**BERT, "architectures": ["BertForSequenceClassification"], "id2label": {"0": "a", "2": "c"}}
    )
    with pytest.raises(ConfigError, match="id2label must name each of the 2 classes"):
        read_folder(path)
    (path / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="tokenizer.json is missing"):
        read_folder(path)
