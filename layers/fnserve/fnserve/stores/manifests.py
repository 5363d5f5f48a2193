"""A manifest kept in a bucket, fetched beside the models it names: what ``FNSERVE_MANIFEST=s3://...`` (or gs://)
serves."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from fnserve.core.errors import ConfigError, InvalidInput
from fnserve.core.models.manifest import step_files
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
