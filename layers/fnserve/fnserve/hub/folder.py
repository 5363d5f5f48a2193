"""What a Hugging Face model folder declares, and what fnserve serves it as.

Read as text-embeddings-inference reads a folder: the task from ``config.json`` (a sequence classifier with one
label is a reranker, with more a classifier; any other model an embedder), the pooling and a Normalize module from
``modules.json`` and ``1_Pooling/config.json``, the prompts from ``config_sentence_transformers.json``, the length
from ``sentence_bert_config.json`` or ``tokenizer_config.json``. A folder that cannot be served this way is refused
with the file and what is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fnserve.core.errors import ConfigError

Kind = Literal["embed", "rerank", "classify"]
POOLING_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "last_token",
}
# modules.json's types by their class: sentence_transformers.models.Pooling before 5.0, ...base.modules.pooling.Pooling
# after.
POOLING, NORMALIZE, TRANSFORMER = "Pooling", "Normalize", "Transformer"
# 1_Pooling/config.json's pooling_mode (sentence-transformers 5), beside the older pooling_mode_* flags.
POOLING_NAMES = {"cls": "cls", "mean": "mean", "max": "max", "lasttoken": "last_token", "last_token": "last_token"}
# The ONNX files Hub repos ship, where they ship one (optimum's layout first, then the root).
ONNX_FILES = ("onnx/model.onnx", "model.onnx")
# Learned positions past the padding id: RoBERTa's family counts from pad_token_id + 1.
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


@dataclass
class Folder:
    """A model folder as read: what it is, and every choice made from its files (``notes`` say each, for the user)."""

    path: Path
    kind: Kind
    architecture: str
    model_type: str
    max_length: int
    onnx: Path | None
    pooling: str = "mean"
    normalize: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    labels: list[str] = field(default_factory=list)
    multi_label: bool = False
    sigmoid: bool = True  # a reranker's score: the logit's sigmoid, or the logit itself
    dimensions: list[int] = field(default_factory=list)  # Matryoshka lengths, which no file declares: the user's
    notes: list[str] = field(default_factory=list)

    @property
    def task(self) -> str:
        """optimum's name for the export's task: the encoder's token embeddings, or the classifier's logits."""
        return "feature-extraction" if self.kind == "embed" else "text-classification"


def _json(path: Path, required: bool = False) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise ConfigError(f"{path} is missing: fnserve import reads a Hugging Face model folder, which has one")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict | list):
        raise ConfigError(f"{path} holds no JSON object")
    return data  # type: ignore[return-value]


def read_folder(path: Path, kind: Kind | None = None) -> Folder:
    """The folder at ``path`` read; ``kind`` overrides what its config says it is."""
    if not path.is_dir():
        raise ConfigError(f"{path} is not a folder: fnserve import reads a Hugging Face model folder")
    config = _json(path / "config.json", required=True) or {}
    if not (path / "tokenizer.json").is_file():
        raise ConfigError(
            f"{path / 'tokenizer.json'} is missing: fnserve tokenizes with Hugging Face tokenizers' fast tokenizer "
            "file; save one with AutoTokenizer.from_pretrained(folder).save_pretrained(folder) (a fast tokenizer)"
        )
    architecture = str((config.get("architectures") or ["?"])[0])
    model_type = str(config.get("model_type", "?"))
    onnx = next((path / name for name in ONNX_FILES if (path / name).is_file()), None)
    weights = [p for p in ("model.safetensors", "pytorch_model.bin") if (path / p).is_file()]
    if onnx is None and not weights and not list(path.glob("model-*.safetensors")):
        raise ConfigError(
            f"{path} holds no model: neither an ONNX file ({', '.join(ONNX_FILES)}) nor weights "
            "(model.safetensors, pytorch_model.bin)"
        )
    found = Folder(path, _kind(config, architecture, kind), architecture, model_type, 0, onnx)
    found.max_length = _max_length(path, config, model_type, found.notes)
    if found.kind == "embed":
        _read_sentence_transformers(path, found)
    elif found.kind == "rerank":
        activation = str((_json(path / "config_sentence_transformers.json") or {}).get("activation_fn") or "Sigmoid")
        found.sigmoid = not activation.endswith("Identity")  # CrossEncoder's default for one label: a sigmoid
        if not found.sigmoid:
            found.notes.append("scores are the raw logits: config_sentence_transformers.json activation_fn Identity")
    elif found.kind == "classify":
        found.labels = _labels(path, config)
        found.multi_label = config.get("problem_type") == "multi_label_classification"
    return found


def _kind(config: dict[str, Any], architecture: str, asked: Kind | None) -> Kind:
    if asked is not None:
        return asked
    if architecture.endswith("ForSequenceClassification"):
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
        return "rerank" if labels == 1 else "classify"
    return "embed"


def _labels(path: Path, config: dict[str, Any]) -> list[str]:
    id2label = config.get("id2label") or {}
    try:
        by_id = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"{path / 'config.json'}: id2label must map class ids to names") from None
    count = int(config.get("num_labels") or len(by_id))
    if sorted(by_id) != list(range(count)):
        raise ConfigError(f"{path / 'config.json'}: id2label must name each of the {count} classes (0 to {count - 1})")
    return [by_id[i] for i in range(count)]


def _max_length(path: Path, config: dict[str, Any], model_type: str, notes: list[str]) -> int:
    """What sentence-transformers truncates to (else the tokenizer's model_max_length), never past the positions
    the model has."""
    positions = int(config.get("max_position_embeddings") or 512) - POSITION_OFFSET.get(model_type, 0)
    bert = _json(path / "sentence_bert_config.json") or {}
    tokenizer = _json(path / "tokenizer_config.json") or {}
    for source, value in (
        ("sentence_bert_config.json max_seq_length", bert.get("max_seq_length")),
        ("tokenizer_config.json model_max_length", tokenizer.get("model_max_length")),
    ):
        if isinstance(value, int | float) and 2 <= value < 1e6:
            length = min(int(value), positions)
            notes.append(
                f"max_length {length}: {source}"
                + (f", cut to the model's {positions} positions" if length < value else "")
            )
            return length
    notes.append(f"max_length {positions}: config.json max_position_embeddings (no shorter length declared)")
    return positions


def _read_sentence_transformers(path: Path, found: Folder) -> None:
    modules = _json(path / "modules.json")
    if modules is None:
        found.notes.append("no modules.json: mean pooling, not normalised (what sentence-transformers makes of it)")
    else:
        if not isinstance(modules, list):
            raise ConfigError(f"{path / 'modules.json'} must be a list of modules")
        for module in modules:
            kind, where = str(module.get("type", "")), str(module.get("path", ""))
            named = kind.rpartition(".")[2]
            if named == POOLING:
                _pooling(path / where / "config.json", found)
            elif named == NORMALIZE:
                found.normalize = True
            elif named != TRANSFORMER:
                raise ConfigError(
                    f"{path / 'modules.json'}: module {kind or '?'} ({where}) is not in the exported encoder; fnserve "
                    "serves a transformer, its pooling and Normalize"
                )
        found.notes.append(
            f"pooling {found.pooling}, {'normalised' if found.normalize else 'not normalised'}: modules.json"
        )
    settings = _json(path / "config_sentence_transformers.json") or {}
    prompts = settings.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ConfigError(f"{path / 'config_sentence_transformers.json'}: prompts must map names to texts")
    found.prompts = {str(k): v for k, v in prompts.items()}
    default = settings.get("default_prompt_name")
    if default is not None and default not in found.prompts:
        raise ConfigError(f"{path / 'config_sentence_transformers.json'}: default_prompt_name {default!r} is no prompt")
    found.default_prompt = default
    if found.prompts:
        named = ", ".join(f"{k} {v!r}" for k, v in found.prompts.items())
        found.notes.append(f"prompts {named}; default {default or 'none'}: config_sentence_transformers.json")


def _pooling(config_path: Path, found: Folder) -> None:
    config = _json(config_path, required=True) or {}
    modes = [mode for key, mode in POOLING_MODES.items() if config.get(key)]
    others = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in POOLING_MODES]
    named = config.get("pooling_mode")
    if isinstance(named, str):
        (modes if named in POOLING_NAMES else others).append(POOLING_NAMES.get(named, named))
    if len(modes) != 1 or others:
        raise ConfigError(
            f"{config_path}: fnserve pools by one mode (cls, mean, max, last token), the file asks for "
            f"{', '.join([*modes, *others]) or 'none'}"
        )
    if config.get("include_prompt") is False:
        raise ConfigError(f"{config_path}: include_prompt false (pooling without the prompt's tokens) is not supported")
    found.pooling = modes[0]
