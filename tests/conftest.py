"""Shared fixtures: manifests pointing at tiny real ONNX models."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ManifestWriter, close_main_loop

# The real servers every tier may share (moto_url, redis_url): started by the first test that asks, once a session.
pytest_plugins = ["tests.helpers.fixtures"]


@pytest.fixture(autouse=True, scope="module")
def close_left_event_loop() -> Iterator[None]:
    """Close the event loop a module left set for the main thread (Mangum makes one, as Lambda keeps one).

    Left alone, it is collected at a random later point, and its unclosed sockets fail whichever
    test is running then (warnings are errors here).
    """
    yield
    close_main_loop()


@pytest.fixture
def write_manifest(tmp_path: Path) -> ManifestWriter:
    """Write model files and a manifest; returns the manifest path.

    Each entry: name, version, data (bytes written to the model file), and any manifest
    fields to add or override (``sha256`` defaults to the data's true hash).
    """

    def write(*entries: dict[str, Any]) -> Path:
        lines = []
        for entry in entries:
            entry = dict(entry)
            data = entry.pop("data", None)
            name, version = entry.setdefault("name", "scale"), entry.setdefault("version", "1")
            path = entry.setdefault("path", f"{name}/{version}/model.onnx")
            if data is not None:
                file = tmp_path / path
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_bytes(data)
                entry.setdefault("sha256", hashlib.sha256(data).hexdigest())
            entry.setdefault("sha256", "0" * 64)
            lines.append("[[models]]")
            for key, value in entry.items():
                if isinstance(value, dict):
                    continue
                lines.append(f"{key} = {_toml(value)}")
            for key, value in entry.items():
                if isinstance(value, dict):
                    for tensor, override in value.items():
                        lines.append(f"[models.{key}.{tensor}]")
                        lines.extend(f"{k} = {_toml(v)}" for k, v in override.items())
        manifest = tmp_path / "manifest.toml"
        manifest.write_text("\n".join(lines) + "\n")
        return manifest

    return write


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (in a list: a provider with its options)
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)
