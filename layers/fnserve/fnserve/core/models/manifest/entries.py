"""The base of every table a manifest holds, and the checks of the fields that name files and their digests."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any, Self

import msgspec


def _decode(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise ValueError(f"Expected `str`, got `{type(value).__name__}`")  # msgspec adds where


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A manifest entry: frozen, and every field the file gives must be one it knows."""

    @classmethod
    def validate(cls, data: Any) -> Self:
        """``data`` (a parsed TOML or JSON table) as this entry; :class:`msgspec.ValidationError` says what is
        wrong and where (``$.models[0].max_batch_size``)."""
        return msgspec.convert(data, cls, dec_hook=_decode)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (not validated again: the caller's values are already entries)."""
        return msgspec.structs.replace(self, **changes)


def sha256_hex(value: str, what: str = "sha256") -> str:
    """A SHA-256 as the manifest keeps it: 64 hex digits, lowercased; ``what`` names it in the error."""
    if not re.fullmatch(r"[0-9a-f]{64}", value.lower()):
        raise ValueError(f"{what} must be 64 hex digits")
    return value.lower()


def data_file_name(name: str) -> str:
    """An external data file's name as the graph gives it, checked to stay below the model's folder (wherever that
    is: a bucket's prefix, the cache) and written plainly (``./w.bin`` as ``w.bin``)."""
    posix = PurePosixPath(name)
    if not name or "\\" in name or posix.is_absolute() or ".." in posix.parts or posix.as_posix() == ".":
        raise ValueError(
            f"external data file {name!r} must be a relative path below the model's folder ('/' between folders, "
            "no '..')"
        )
    return posix.as_posix()
