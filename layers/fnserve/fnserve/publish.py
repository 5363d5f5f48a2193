"""Manifests that fnserve writes, so that nobody types a sha256.

``fnserve manifest add`` appends a model's entry: its checksum computed, its graph loaded (a file
onnxruntime cannot load is refused before anything is written), the file copied into the
manifest's ``NAME/VERSION/model.onnx`` layout when it lives elsewhere. ``fnserve models push``
uploads every file a manifest names to a bucket and writes a manifest there whose model paths are
that bucket's URIs, for ``FNSERVE_MANIFEST=s3://...`` (SAM's ``ModelBucket`` and
``ModelManifestKey``) or ``gs://...``.

``add`` appends its entry as text at the end of the file (TOML lets ``[[models]]`` tables come
anywhere), so the rest of the file, comments included, stays byte for byte as it was; both check
what they write with the loader that serves it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w

from fnserve.core.errors import ConfigError, ModelLoadError
from fnserve.core.models.manifest import ModelSettings, load_manifest, refused_at, step_files
from fnserve.core.models.registry import TensorSpec, tensor_specs
from fnserve.stores import objects


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
    text = _read_text(manifest) if manifest.exists() else HEADER
    current = _parse(text, manifest)
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
        _write_checked(manifest, text + separator + tomli_w.dumps({"models": [entry]}))
    except ConfigError:
        if made is not None:
            shutil.rmtree(made) if made.is_dir() else made.unlink()
        raise
    return Added(entry, target, copied, inputs, outputs)


@dataclass
class Pushed:
    """What ``models push`` did: every file it uploaded or found there already, and the manifest's URI."""

    manifest_uri: str
    uploaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def push(manifest: Path, destination: str) -> Pushed:
    """Upload the models and step files ``manifest`` names under ``destination`` (``s3://bucket/prefix`` or
    ``gs://bucket/prefix``), and a manifest beside them (``prefix/manifest.toml``) whose model paths are
    their URIs there. A file already there with the same sha256 is not uploaded again.

    A model whose file does not match its sha256 stops the push before anything is uploaded: a
    manifest that could not load is never published.
    """
    scheme, sep, rest = destination.partition("://")
    if not sep or scheme not in objects.SCHEMES or not rest.split("/")[0]:
        raise ConfigError(f"{destination!r} must be s3://bucket[/prefix] or gs://bucket[/prefix]")
    bucket, _, prefix = rest.partition("/")
    base = f"{scheme}://{bucket}"
    prefix = prefix.strip("/")

    def key(relative: str) -> str:
        return f"{prefix}/{relative}" if prefix else relative

    loaded = load_manifest(manifest)  # validated as a server would, relative paths against its directory
    data = _parse(_read_text(manifest), manifest)
    uploads: list[tuple[Path, str, str]] = []  # (file, key, sha256)
    for entry, settings in zip(data["models"], loaded.models, strict=True):
        if "://" in settings.path:
            continue  # already in a bucket
        local = _resolve(loaded.base_dir, settings.path)
        where = f"model {settings.name!r} version {settings.version!r}"
        if not local.is_file():
            raise ConfigError(f"{where}: file {local} does not exist")
        digest = file_sha256(local)
        if digest != settings.sha256:
            raise ConfigError(f"{where}: file {local} has sha256 {digest}, but the manifest says {settings.sha256}")
        relative = _relative(settings.path) or f"{settings.name}/{settings.version}/{local.name}"
        uploads.append((local, key(relative), digest))
        entry["path"] = f"{base}/{key(relative)}"
    for asset, required in step_files(data):
        local = _resolve(loaded.base_dir, asset)
        if not local.is_file():
            if not required:
                continue  # a custom step's module that is installed, not shipped beside the manifest
            raise ConfigError(f"{asset} (named by a pipeline step) does not exist beside {manifest}")
        below = _relative(asset)
        if below is None:
            raise ConfigError(f"{asset}: a step's file must be relative to the manifest to be pushed beside it")
        uploads.append((local, key(below), file_sha256(local)))

    pushed = Pushed(manifest_uri=f"{base}/{key('manifest.toml')}")
    for local, object_key, digest in uploads:
        uri = f"{base}/{object_key}"
        if objects.stored_sha256(uri) == digest:
            pushed.unchanged.append(uri)
        else:
            objects.upload_file(local, uri, digest)
            pushed.uploaded.append(uri)
    with tempfile.TemporaryDirectory() as scratch:
        written = Path(scratch) / "manifest.toml"
        note = f"# Written by `fnserve models push` from {manifest.name}: edit that file and push again.\n\n"
        written.write_text(note + tomli_w.dumps(data), encoding="utf-8")
        load_manifest(written)  # what a server will load from the bucket
        objects.upload_file(written, pushed.manifest_uri, file_sha256(written))
    pushed.uploaded.append(pushed.manifest_uri)
    return pushed


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


def _read_text(manifest: Path) -> str:
    if manifest.suffix != ".toml":
        raise ConfigError(f"{manifest}: only TOML manifests are edited and pushed")
    try:
        return manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"manifest {manifest} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"manifest {manifest} cannot be read: {exc}") from exc


def _parse(text: str, manifest: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"manifest {manifest} cannot be read: {exc}") from exc


def _write_checked(manifest: Path, text: str) -> None:
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


def _resolve(base_dir: Path, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else base_dir / path


def _relative(path: str) -> str | None:
    """``path`` as an object key below the manifest's, or None when it is absolute or climbs out of its folder."""
    posix = PurePosixPath(path.replace(os.sep, "/"))
    if posix.is_absolute() or ".." in posix.parts:
        return None
    return posix.as_posix()


def _first_error(exc: ValueError) -> str:
    """msgspec's message with the field it names first: ``max_batch_size: Expected `int` >= 1``."""
    loc, message = refused_at(exc)
    return f"{'.'.join(map(str, loc))}: {message}" if loc else message
