"""Manifests that fnserve writes, so that nobody types a sha256.

``fnserve manifest add`` appends a model's entry: its checksum computed, its graph loaded (a file
onnxruntime cannot load is refused before anything is written), the file copied into the
manifest's ``NAME/VERSION/model.onnx`` layout when it lives elsewhere, with the data files its graph
keeps tensors in beside it (their checksums in the entry's ``external_data``). It appends its entry as
text at the end of the file (TOML lets ``[[models]]`` tables come anywhere), so the rest of the
file, comments included, stays byte for byte as it was, and checks what it writes with the loader
that serves it. ``fnserve models push`` is :func:`fnserve.stores.manifests.push`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from fnserve.core.errors import ConfigError, ModelLoadError, refused_at
from fnserve.core.models import external
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.registry import TensorSpec, tensor_specs


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True)
class Added:
    """What ``manifest add`` wrote: the entry, where the model file is (and its data files), and the graph's
    tensors."""

    entry: dict[str, Any]
    model_file: Path
    copied: bool
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    data_files: tuple[str, ...] = ()  # the graph's external data, by the names it gives them, beside model_file
    pipeline: dict[str, Any] | None = None  # the text pipeline written around it (--tokenizer), if one was


# A text encoder's padded lengths (each run pads to the least that holds its longest text) and token inputs.
TEXT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
POOLING = ("mean", "cls", "max", "last_token")


def text_model_fields(inputs: list[str], max_length: int) -> dict[str, Any]:
    """A text encoder's batching fields: runs cut by length bucket and by the token and attention budget."""
    return {
        "max_batch_size": 64,
        "max_batch_time_ms": 2.0,
        "length_buckets": [b for b in TEXT_BUCKETS if b < max_length] + [max_length],
        # A run holds at least one text of max_length; short texts batch by the dozen, long ones a few at a time.
        "max_batch_tokens": max(1024, max_length),
        "max_batch_attention": max(32768, max_length * max_length),
        "pad_inputs": [n for n in TEXT_INPUTS if n in inputs],
    }


def token_embeddings(outputs: dict[str, int]) -> str | None:
    """The output holding a text encoder's token embeddings ([rows, tokens, dim]): by its usual names, else the
    only one of that rank; ``outputs`` maps each output to its rank."""
    named = next((n for n in ("last_hidden_state", "token_embeddings") if outputs.get(n) == 3), None)
    return named or next((n for n, rank in outputs.items() if rank == 3), None)


def add_model(
    manifest: Path,
    model: Path,
    name: str,
    *,
    version: str | None = None,
    description: str | None = None,
    max_batch_size: int | None = None,
    copy: bool = True,
    tokenizer: Path | None = None,
    pooling: str = "mean",
    max_length: int = 512,
    normalize: bool = True,
) -> Added:
    """Append ``model`` to ``manifest`` (created if it does not exist) as ``name`` at ``version`` (default: one
    above the highest integer version of ``name``, else 1).

    With a ``tokenizer`` (a Hugging Face tokenizer.json), ``model`` is a text encoder: it is added as
    ``NAME-onnx``, batched by tokens, and the pipeline ``NAME`` around it takes text and answers its ``pooling``
    embedding (normalised unless told), served on V2 and OpenAI's embeddings API; the tokenizer is copied to
    ``NAME/tokenizer.json``. A later version of the model keeps the pipeline it has.

    Raises :class:`ConfigError` saying what is wrong, leaving the manifest and its folder as they were: a file
    onnxruntime cannot load, a name or version the manifest already has, a name the manifest would refuse.
    """
    inputs, outputs = _graph_tensors(model)
    data_files = external.graph_files(model)
    text = manifest_text(manifest) if manifest.exists() else HEADER
    current = parse(text, manifest)
    served, pipeline = name, None
    if tokenizer is not None:
        served = f"{name}-onnx"
        pipeline = _text_pipeline(current, manifest, name, served, inputs, outputs, pooling, max_length, normalize)
    entries = current.get("models", [])
    versions = [str(e.get("version", "1")) for e in entries if isinstance(e, dict) and e.get("name") == served]
    if version is None:
        version = str(max((int(v) for v in versions if v.isdigit()), default=0) + 1)
    elif version in versions:
        raise ConfigError(f"{manifest} already has model {served!r} version {version!r}: give another --version")

    root = manifest.resolve().parent
    source = model.resolve()
    target, copied = source, False
    if not source.is_relative_to(root) and copy:
        target, copied = root / name / version / "model.onnx", True
    path = target.relative_to(root).as_posix() if target.is_relative_to(root) else str(target)
    entry: dict[str, Any] = {"name": served, "version": version, "path": path, "sha256": file_sha256(source)}
    if tokenizer is not None:
        entry |= text_model_fields([spec.name for spec in inputs], max_length)
    if data_files:
        entry["external_data"] = {file: file_sha256(source.parent / file) for file in data_files}
    if description:
        entry["description"] = description
    if max_batch_size is not None:
        entry["max_batch_size"] = max_batch_size
    try:
        ModelSettings.validate(entry)  # the name and the fields, before any file is copied
    except ValueError as exc:
        raise ConfigError(f"model {name!r} cannot be added: {_first_error(exc)}") from None

    # The graph and its data files, each to where the graph will look for it: by its name, beside the copy.
    copies = [(source, target, entry["sha256"])] if copied else []
    copies += [(source.parent / f, target.parent / f, entry["external_data"][f]) for f in data_files if copied]
    tables: dict[str, Any] = {"models": [entry]}
    if tokenizer is not None:
        if not tokenizer.is_file():
            raise ConfigError(f"{tokenizer} does not exist")
        copies.append((tokenizer, root / name / "tokenizer.json", file_sha256(tokenizer)))
        if pipeline is not None:
            tables["pipelines"] = [pipeline]
    for _, copy_to, digest in copies:
        if copy_to.exists() and file_sha256(copy_to) != digest:
            raise ConfigError(f"{copy_to} exists with other content: remove it, or give another --version")
    made: list[Path] = []  # removed if the manifest is refused: each copy, or the first folder made for it
    separator = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    try:
        for copy_from, copy_to, _ in copies:
            if not copy_to.exists():
                made.append(_first_missing(copy_to))
                copy_to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(copy_from, copy_to)
        write_checked(manifest, text + separator + tomli_w.dumps(tables))
    except BaseException as exc:
        for added in reversed(made):
            shutil.rmtree(added) if added.is_dir() else added.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ConfigError(f"model {name!r} cannot be added: {exc}") from exc
        raise
    return Added(entry, target, copied, inputs, outputs, tuple(data_files), tables.get("pipelines", [None])[0])


def _text_pipeline(
    current: dict[str, Any],
    manifest: Path,
    name: str,
    model: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    pooling: str,
    max_length: int,
    normalize: bool,
) -> dict[str, Any] | None:
    """The embedding pipeline ``name`` around the text encoder ``model``; None where the manifest has it already."""
    if "input_ids" not in {spec.name for spec in inputs}:
        takes = [spec.name for spec in inputs]
        raise ConfigError(f"--tokenizer: the graph takes no input_ids (it takes {takes}): not a text encoder")
    tokens = token_embeddings({spec.name: len(spec.shape) for spec in outputs})
    if tokens is None:
        raise ConfigError(
            "--tokenizer makes an embedding pipeline, and the graph has no token embeddings output "
            "([rows, tokens, dim]): a classifier or reranker is served by fnserve import from its folder"
        )
    if pooling not in POOLING:
        raise ConfigError(f"--pooling takes one of {', '.join(POOLING)}, not {pooling!r}")
    found = next((p for p in current.get("pipelines", []) if isinstance(p, dict) and p.get("name") == name), None)
    if found is not None:
        if found.get("model") != model:
            raise ConfigError(f"{manifest} has a pipeline {name!r} of another model: give another --name")
        return None
    return {
        "name": name,
        "model": model,
        "description": f"text in; its {pooling}-pooled embedding out",
        "pre": [{"step": "tokenize", "tokenizer": f"{name}/tokenizer.json", "max_length": max_length}],
        "post": [{"step": "pool", "mode": pooling, "input": tokens, "normalize": normalize}],
    }


def _first_missing(path: Path) -> Path:
    """``path`` or the highest of its folders that does not exist yet: what making it adds."""
    while not path.parent.exists():
        path = path.parent
    return path


def _graph_tensors(model: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The graph's inputs and outputs, as the server will show them; a file onnxruntime cannot load, or
    with a tensor type fnserve cannot serve, is refused."""
    import onnxruntime as ort

    if not model.is_file():
        raise ConfigError(f"{model} does not exist")
    try:
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types for a bad file
        raise ConfigError(f"{model} is not a model onnxruntime can load: {exc}") from None
    where = str(model)
    try:
        return (
            tensor_specs(session.get_inputs(), {}, where, "input"),
            tensor_specs(session.get_outputs(), {}, where, "output"),
        )
    except ModelLoadError as exc:
        raise ConfigError(exc.message) from None


HEADER = "# fnserve model manifest: paths are relative to this file.\n"


def manifest_text(manifest: Path) -> str:
    """A TOML manifest's text, or the ConfigError saying why it cannot be edited."""
    if manifest.suffix != ".toml":
        raise ConfigError(f"{manifest}: only TOML manifests are edited and pushed")
    try:
        return manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"manifest {manifest} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"manifest {manifest} cannot be read: {exc}") from exc


def parse(text: str, manifest: Path) -> dict[str, Any]:
    """A manifest's text as TOML tables, or the ConfigError saying where it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"manifest {manifest} cannot be read: {exc}") from exc


def write_checked(manifest: Path, text: str) -> None:
    """Write ``text`` over ``manifest`` only if the loader accepts it (the temporary file sits beside it,
    so relative paths resolve as they will)."""
    candidate = manifest.with_name(f".{manifest.name}.new.toml")
    candidate.write_text(text, encoding="utf-8")
    try:
        load_manifest(candidate)
    except ConfigError as exc:
        candidate.unlink()
        raise ConfigError(exc.message.replace(str(candidate), str(manifest))) from None
    os.replace(candidate, manifest)


def _first_error(exc: ValueError) -> str:
    """msgspec's message with the field it names first: ``max_batch_size: Expected `int` >= 1``."""
    loc, message = refused_at(exc)
    return f"{'.'.join(map(str, loc))}: {message}" if loc else message
