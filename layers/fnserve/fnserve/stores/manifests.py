"""A manifest kept in a bucket beside the models it names: pushed there (``fnserve models push``), and fetched back
where ``FNSERVE_MANIFEST=s3://...`` or ``gs://...`` serves it.

A push uploads every file the manifest names (a model's data files beside it) and writes a manifest there whose model
paths are that bucket's URIs (SAM's ``ModelBucket`` and ``ModelManifestKey``); it checks what it writes with the loader
that serves it.
"""

from __future__ import annotations

import json
import os
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from fnserve.core.errors import ConfigError, InvalidInput
from fnserve.core.models import external
from fnserve.core.models.manifest.loading import load_manifest, step_files
from fnserve.observability.logs import logger
from fnserve.stores import objects


def fetch_manifest(uri: str, directory: Path) -> Path:
    """An s3:// or gs:// manifest fetched into ``directory`` with the files its pipelines read, its relative model
    paths made URIs in the same bucket; the local file's path."""
    where = uri.rpartition("/")[0]  # scheme://bucket[/prefix]
    manifest = tomllib.loads(objects.get_bytes(uri).decode())
    for model in manifest.get("models", []):
        path = str(model.get("path", ""))
        if "://" not in path and not path.startswith("/"):
            model["path"] = f"{where}/{path}"
    target = directory / "manifest.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    # The files pipeline steps read (tokenizers, labels, custom steps' modules) come from beside it too. One
    # missing makes its pipeline unservable (named when it is built), not the models: they load lazily too.
    for relative, required in step_files(manifest):
        if relative.startswith("/") or ".." in relative.split("/"):
            raise ConfigError(f"{relative}: a step's file in a fetched manifest must be relative, below it")
        local = target.parent / relative
        try:
            data = objects.get_bytes(f"{where}/{relative}")
        except InvalidInput as exc:
            if required:  # else a custom step's module that is installed, not shipped beside the manifest
                logger.warning(f"a pipeline's file is missing beside the manifest: {exc.message}")
            continue
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(data)
    target.write_text(json.dumps(manifest))
    return target


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

    A model whose file (its graph, or a data file beside it) does not match its sha256 stops the push before
    anything is uploaded: a manifest that could not load is never published.
    """
    import tomli_w  # the command line's extra: a function serving a bucket's manifest fetches it without it

    from fnserve.core.models.writing import file_sha256, manifest_text, parse

    scheme, sep, rest = destination.partition("://")
    if not sep or scheme not in objects.SCHEMES or not rest.split("/")[0]:
        raise ConfigError(f"{destination!r} must be s3://bucket[/prefix] or gs://bucket[/prefix]")
    bucket, _, prefix = rest.partition("/")
    base = f"{scheme}://{bucket}"
    prefix = prefix.strip("/")

    def key(relative: str) -> str:
        return f"{prefix}/{relative}" if prefix else relative

    loaded = load_manifest(manifest)  # validated as a server would, relative paths against its directory
    data = parse(manifest_text(manifest), manifest)
    uploads: list[tuple[Path, str, str]] = []  # (file, key, sha256)
    for entry, settings in zip(data["models"], loaded.models, strict=True):
        if "://" in settings.path:
            continue  # already in a bucket
        local = _resolve(loaded.base_dir, settings.path)
        where = f"model {settings.name!r} version {settings.version!r}"
        relative = _relative(settings.path) or f"{settings.name}/{settings.version}/{local.name}"
        uploads.append((local, key(relative), _checked_sha256(local, settings.sha256, where)))
        for name, digest in settings.external_data.items():  # beside it, by the names its graph gives them
            data_file = local.parent / name
            uploads.append((data_file, key(external.beside(relative, name)), _checked_sha256(data_file, digest, where)))
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


def _checked_sha256(local: Path, sha256: str, where: str) -> str:
    """The sha256 of a model's file ``local`` (its graph, or a data file), if it is the manifest's."""
    from fnserve.core.models.writing import file_sha256

    if not local.is_file():
        raise ConfigError(f"{where}: file {local} does not exist")
    digest = file_sha256(local)
    if digest != sha256:
        raise ConfigError(f"{where}: file {local} has sha256 {digest}, but the manifest says {sha256}")
    return digest


def _resolve(base_dir: Path, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else base_dir / path


def _relative(path: str) -> str | None:
    """``path`` as an object key below the manifest's, or None when it is absolute or climbs out of its folder."""
    posix = PurePosixPath(path.replace(os.sep, "/"))
    if posix.is_absolute() or ".." in posix.parts:
        return None
    return posix.as_posix()
