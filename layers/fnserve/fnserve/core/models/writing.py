"""Manifests that fnserve writes, so that nobody types a sha256.

``fnserve manifest add`` appends a model's entry: its checksum computed, its graph loaded (a file
onnxruntime cannot load is refused before anything is written), the file copied into the
manifest's ``NAME/VERSION/model.onnx`` layout when it lives elsewhere. It appends its entry as
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

from fnserve.core.errors import ConfigError, ModelLoadError
from fnserve.core.models.manifest import ModelSettings, load_manifest, refused_at
from fnserve.core.models.registry import TensorSpec, tensor_specs


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True)
class Added:
    """What ``manifest add`` wrote: the entry, where the model file is, and the graph's tensors."""

    entry: dict[str, Any]
    model_file: Path
    copied: bool
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def add_model(
    manifest: Path,
    model: Path,
    name: str,
    *,
    version: str | None = None,
    description: str | None = None,
    max_batch_size: int | None = None,
    copy: bool = True,
) -> Added:
    """Append ``model`` to ``manifest`` (created if it does not exist) as ``name`` at ``version`` (default: one
    above the highest integer version of ``name``, else 1).

    Raises :class:`ConfigError` saying what is wrong, leaving the manifest as it was: a file onnxruntime
    cannot load, a name or version the manifest already has, a name the manifest would refuse.
    """
    inputs, outputs = _graph_tensors(model)
    text = manifest_text(manifest) if manifest.exists() else HEADER
    current = parse(text, manifest)
    entries = current.get("models", [])
    versions = [str(e.get("version", "1")) for e in entries if isinstance(e, dict) and e.get("name") == name]
    if version is None:
        version = str(max((int(v) for v in versions if v.isdigit()), default=0) + 1)
    elif version in versions:
        raise ConfigError(f"{manifest} already has model {name!r} version {version!r}: give another --version")

    root = manifest.resolve().parent
    source = model.resolve()
    target, copied = source, False
    if not source.is_relative_to(root) and copy:
        target, copied = root / name / version / "model.onnx", True
    path = target.relative_to(root).as_posix() if target.is_relative_to(root) else str(target)
    entry: dict[str, Any] = {"name": name, "version": version, "path": path, "sha256": file_sha256(source)}
    if description:
        entry["description"] = description
    if max_batch_size is not None:
        entry["max_batch_size"] = max_batch_size
    try:
        ModelSettings.validate(entry)  # the name and the fields, before any file is copied
    except ValueError as exc:
        raise ConfigError(f"model {name!r} cannot be added: {_first_error(exc)}") from None

    made: Path | None = None  # removed if the manifest is refused: the copy, or the first folder made for it
    if copied and target.exists():
        if file_sha256(target) != entry["sha256"]:
            raise ConfigError(f"{target} exists with other content: remove it, or give another --version")
    elif copied:
        made = target
        while not made.parent.exists():
            made = made.parent
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    separator = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    try:
        write_checked(manifest, text + separator + tomli_w.dumps({"models": [entry]}))
    except ConfigError:
        if made is not None:
            shutil.rmtree(made) if made.is_dir() else made.unlink()
        raise
    return Added(entry, target, copied, inputs, outputs)


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
