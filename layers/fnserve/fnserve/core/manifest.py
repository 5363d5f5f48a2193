"""Reading the model manifest (TOML) into validated :class:`~fnserve.core.settings.Manifest`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from pydantic import ValidationError

from fnserve.core.errors import ConfigError
from fnserve.core.settings import Manifest


def load_manifest(path: str | Path) -> Manifest:
    """Parse and validate a manifest file; relative model paths resolve against its directory.

    Every problem is a :class:`ConfigError` naming the file and the offending field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        # TOML is the format people write; JSON (a TOML-shaped document) is what fnserve writes itself.
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"manifest {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"manifest {path} cannot be read: {exc}") from exc
    data.setdefault("base_dir", str(path.resolve().parent))
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"manifest {path} is invalid: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "manifest"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
