"""What ships installs from locks (infra/locks.py): each must be what pyproject's ranges compile to today, so a
range raised in pyproject cannot leave an image or the layer on a version the library no longer allows."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

LOCKS = ["infra/container/requirements.lock", "infra/container/requirements-cuda.lock"]
LOCKS += ["infra/container/lambda-requirements.lock", "infra/gcp/requirements.lock", "layers/fnserve/requirements.txt"]


def check(root: Path, *only: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REPO / "infra" / "locks.py"), "--check", "--root", str(root), *only]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_every_lock_is_what_pyproject_compiles_to() -> None:
    done = check(REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_a_lock_pinning_what_pyproject_no_longer_allows_is_stale(tmp_path: Path) -> None:
    for name in ["pyproject.toml", "README.md", "LICENSE", *LOCKS]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "layers" / "fnserve" / "fnserve", tmp_path / "layers" / "fnserve" / "fnserve")
    # The Cloud Functions' lock pinned below pyproject's floor (as a floor raised after the lock was made leaves it).
    floor = re.search(r'"msgspec>=([^"]+)"', (tmp_path / "pyproject.toml").read_text())
    assert floor is not None and floor.group(1) == "0.18.6"
    lock = tmp_path / "infra" / "gcp" / "requirements.lock"
    lock.write_text(re.sub(r"^msgspec==\S+$", "msgspec==0.18.5", lock.read_text(), count=1, flags=re.MULTILINE))
    # That lock alone (the one uv resolves soonest): the test above recompiles them all, and a stale one is found the
    # same way in each.
    done = check(tmp_path, "--only", "infra/gcp/requirements.lock")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "-msgspec==0.18.5" in done.stdout and "infra/gcp/requirements.lock" in done.stderr


def test_a_lock_that_is_not_there_is_named_with_the_ones_that_are(tmp_path: Path) -> None:
    done = check(REPO, "--only", "infra/no-such.lock")
    assert done.returncode == 2 and "no lock 'infra/no-such.lock'" in done.stderr, done.stderr
    assert "layers/fnserve/requirements.txt" in done.stderr
