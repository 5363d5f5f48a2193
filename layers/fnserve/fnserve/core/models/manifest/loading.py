"""The file whole: the :class:`Manifest` that holds every table and checks them against each other, and
:func:`load_manifest`, which reads a TOML (or JSON) file into it and names the entry a problem is in."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from fnserve.core.errors import ConfigError, refused_at
from fnserve.core.models.manifest.cascades import CascadeSettings
from fnserve.core.models.manifest.entries import Entry
from fnserve.core.models.manifest.groups import WorkerGroup
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.manifest.pipelines import PipelineSettings


class Manifest(Entry, frozen=True, kw_only=True):
    """The model manifest: every model version this deployment serves, its pipelines and its cascades."""

    models: Annotated[list[ModelSettings], Meta(min_length=1, description="Served model versions.")]
    pipelines: Annotated[list[PipelineSettings], Meta(description="Steps around models.")] = []
    cascades: Annotated[list[CascadeSettings], Meta(description="Fast-then-accurate model pairs.")] = []
    groups: Annotated[
        list[WorkerGroup], Meta(description="Which models run in which worker processes of `fnserve serve`.")
    ] = []
    base_dir: Annotated[Path, Meta(description="Directory relative model paths are resolved against.")] = Path(".")

    def __post_init__(self) -> None:
        seen: set[tuple[str, str]] = set()
        for model in self.models:
            key = (model.name, model.version)
            if key in seen:
                raise ValueError(f"model {model.name!r} version {model.version!r} is listed twice")
            seen.add(key)
        models = {m.name for m in self.models}
        taken = set(models)
        for pipeline in self.pipelines:
            if pipeline.name in taken:
                raise ValueError(f"pipeline {pipeline.name!r}: the name is already a model's or a pipeline's")
            if pipeline.model not in models:
                raise ValueError(f"pipeline {pipeline.name!r}: its model {pipeline.model!r} is not in the manifest")
            if pipeline.version is not None and (pipeline.model, pipeline.version) not in seen:
                raise ValueError(
                    f"pipeline {pipeline.name!r}: model {pipeline.model!r} has no version {pipeline.version!r}"
                )
            taken.add(pipeline.name)
        served = set(taken)
        for cascade in self.cascades:
            if cascade.name in taken:
                raise ValueError(
                    f"cascade {cascade.name!r}: the name is already a model's, a pipeline's or a cascade's"
                )
            for role, member in (("fast", cascade.fast), ("slow", cascade.slow)):
                if member not in served:
                    raise ValueError(
                        f"cascade {cascade.name!r}: its {role} model {member!r} is not in the manifest "
                        "(as a model or a pipeline)"
                    )
            taken.add(cascade.name)
        placed: dict[str, str] = {}  # model -> its group
        named: set[str] = set()
        for group in self.groups:
            if group.name in named:
                raise ValueError(f"worker group {group.name!r} is listed twice")
            named.add(group.name)
            for name in group.models:
                if name not in models:
                    raise ValueError(f"worker group {group.name!r}: model {name!r} is not in the manifest")
                if name in placed:
                    raise ValueError(f"model {name!r} is in two worker groups: {placed[name]!r} and {group.name!r}")
                placed[name] = group.name

    def group_of(self, model: str) -> WorkerGroup | None:
        """The worker group that runs ``model`` (None: the front process does)."""
        return next((group for group in self.groups if model in group.models), None)

    def holding(self, group: str) -> Manifest:
        """What a worker of ``group`` loads: the group's models alone (no pipelines, cascades or groups)."""
        found = next((g for g in self.groups if g.name == group), None)
        if found is None:
            raise ValueError(f"the manifest has no worker group {group!r}")
        kept = [m for m in self.models if m.name in found.models]
        return self.replace(models=kept, pipelines=[], cascades=[], groups=[])


def step_files(data: dict[str, Any]) -> Iterator[tuple[str, bool]]:
    """The files a manifest's pipeline steps name, as written (``data`` is the parsed file, before
    validation), each once, with whether it must exist beside the manifest: tokenizers and label files
    must; a custom step's module (``module:function`` -> ``module.py``) may be installed instead."""
    seen: set[str] = set()
    for pipeline in data.get("pipelines", []):
        for step in (*pipeline.get("pre", []), *pipeline.get("post", [])):
            named = [(step.get("tokenizer"), True), (step.get("labels"), True)]
            if isinstance(step.get("function"), str):
                named.append((step["function"].partition(":")[0].replace(".", "/") + ".py", False))
            for path, required in named:
                if isinstance(path, str) and path not in seen:
                    seen.add(path)
                    yield path, required


def load_manifest(path: str | Path) -> Manifest:
    """Parse and validate a manifest file; relative model paths resolve against its directory.

    Every problem is a :class:`ConfigError` naming the file and the offending field.
    """
    path = Path(path)
    if path.suffix == ".onnx":
        raise ConfigError(_not_a_manifest(path))
    try:
        text = path.read_text(encoding="utf-8")
        # TOML is the format people write; JSON (a TOML-shaped document) is what fnserve writes itself.
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"manifest {path} does not exist") from None
    except UnicodeDecodeError:  # binary: a model, most likely, where a manifest was expected
        raise ConfigError(_not_a_manifest(path)) from None
    except (OSError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"manifest {path} cannot be read: {exc}") from exc
    data.setdefault("base_dir", str(path.resolve().parent))
    try:
        return Manifest.validate(data)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"manifest {path} is invalid: {_describe(exc, data)}") from None


def _not_a_manifest(path: Path) -> str:
    return (
        f"{path} is not a manifest (TOML) but a binary file, a model perhaps: fnserve serves the models a "
        f"manifest lists. Write one with `fnserve manifest add {path} --name NAME --manifest manifest.toml`, "
        "then serve manifest.toml"
    )


def _describe(exc: msgspec.ValidationError, data: dict[str, Any]) -> str:
    """The error by where it is: a model, pipeline or cascade entry by its name (and position), then the field."""
    loc, message = refused_at(exc)
    where = ".".join(map(str, loc)) or "manifest"
    section, index = loc[:2] if len(loc) >= 2 else ("", None)
    entries = data.get(str(section))
    if isinstance(index, int) and isinstance(entries, list) and index < len(entries):
        name = entries[index].get("name") if isinstance(entries[index], dict) else None
        if isinstance(name, str):
            kind = {"models": "model", "pipelines": "pipeline", "cascades": "cascade"}.get(str(section), str(section))
            rest = ".".join(map(str, loc[2:]))
            where = f"{kind} {name!r} ({section}.{index})" + (f" {rest}" if rest else "")
    return f"{where}: {message}"
