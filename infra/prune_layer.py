"""Remove from a built Lambda layer the distributions only huggingface_hub needs.

tokenizers requires huggingface_hub for ``Tokenizer.from_pretrained``, which fnserve never calls (a pipeline's
tokenizer is a file): the hub and what it alone requires are megabytes of a layer that nothing imports, under a
250 MB limit shared with the models. Which distributions those are is read from the layer's lock (its ``# via``
lines), so a new requirement of the hub is pruned too; each is removed by the files its RECORD lists.

    python infra/prune_layer.py LOCK SITE_PACKAGES      (make sam-build runs it)
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

PRUNED = "huggingface-hub"


def required_by(lock: str) -> dict[str, set[str]]:
    """Each locked distribution (normalised name) -> the distributions the lock says require it."""
    found: dict[str, set[str]] = {}
    current = None
    for line in lock.splitlines():
        pinned = re.match(r"^([A-Za-z0-9_.-]+)==", line)
        if pinned:
            current = normalise(pinned.group(1))
            found[current] = set()
        elif current and (via := re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9_.-]+)\s*$", line)):
            if via.group(1) != "via":
                found[current].add(normalise(via.group(1)))
    return found


def only_for(root: str, lock: str) -> set[str]:
    """``root`` and every distribution that nothing but ``root`` (and those) requires."""
    requirers, only = required_by(lock), {root}
    while grown := {name for name, by in requirers.items() if name not in only and by and by <= only}:
        only |= grown
    return only


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def prune(site: Path, names: set[str]) -> list[str]:
    """Remove the installed distributions ``names`` from ``site``; the ones removed."""
    removed = []
    for info in site.glob("*.dist-info"):
        if normalise(info.name.removesuffix(".dist-info").rsplit("-", 1)[0]) not in names:
            continue
        for line in (info / "RECORD").read_text().splitlines():
            path = site / line.split(",", 1)[0]
            if path.resolve().is_relative_to(site.resolve()) and path.is_file():
                path.unlink()
        shutil.rmtree(info, ignore_errors=True)
        removed.append(info.name)
    for folder in sorted(site.iterdir(), reverse=True):  # the packages' folders, emptied by their RECORDs
        if folder.is_dir() and not any(p.is_file() for p in folder.rglob("*")):
            shutil.rmtree(folder)
    return removed


if __name__ == "__main__":
    lock, site = Path(sys.argv[1]), Path(sys.argv[2])
    gone = prune(site, only_for(PRUNED, lock.read_text()))
    print(f"pruned from the layer (only {PRUNED} needs them): {', '.join(sorted(gone)) or 'none'}")
