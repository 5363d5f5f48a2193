"""Every documented install works: a fresh virtualenv with exactly the extras a Dockerfile or the README names
runs that install's entry command, so a dependency missing from an extra fails here, not in a user's image.

The extra sets are read from the files that name them (the Dockerfiles' ``pip install ".[...]"``, the
README's ``pip install 'fnserve[...]'``), not copied: a new one is tested as soon as it is written.
The virtualenvs are made by uv (from its cache, in seconds; the system's trust store, as pip's, for a
machine behind a TLS proxy); GPU-only extras are left out, their wheels need a GPU machine (``make test-gpu``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import DEMO_MANIFEST, REPO
from tests.moto import free_port
from tests.servers import start_http

UV = str(Path(sys.executable).parent / "uv")
GPU_ONLY = {"gpu", "tensorrt"}
DOCKERFILES = sorted((REPO / "infra" / "container").glob("*Dockerfile"))


def documented() -> dict[frozenset[str], str]:
    """Every extra set an install instruction names, with where it is named."""
    found: dict[frozenset[str], str] = {}
    for path in [*DOCKERFILES, REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for extras in re.findall(r"""pip install[^\n]*?(?:\.|fnserve)\[([a-z0-9_,-]+)\]""", path.read_text()):
            wanted = frozenset(extras.split(",")) - GPU_ONLY
            found.setdefault(wanted, path.name)
    return found


SETS = documented()


def venv(tmp_path: Path, extras: frozenset[str]) -> Path:
    """A new virtualenv with fnserve and exactly ``extras``; its bin directory."""
    target = tmp_path / "venv"
    subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, str(target)], check=True)
    spec = f"{REPO}[{','.join(sorted(extras))}]" if extras else str(REPO)
    done = subprocess.run(
        [UV, "pip", "install", "--quiet", "--native-tls", "--python", str(target / "bin" / "python"), spec],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return target / "bin"


def test_the_images_and_the_readme_name_extra_sets() -> None:
    assert frozenset({"server", "grpc", "aws", "redis"}) in SETS  # the server image's
    assert frozenset({"lambda", "aws"}) in SETS  # the Lambda image's
    assert frozenset({"server"}) in SETS  # the README's 'fnserve[server,gpu]', on a CPU


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("extras", sorted(SETS, key=sorted), ids=lambda extras: ",".join(sorted(extras)) or "none")
def test_each_documented_extra_set_runs_its_entry_command(extras: frozenset[str], tmp_path: Path) -> None:
    bin_dir = venv(tmp_path, extras)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FNSERVE_MANIFEST": str(DEMO_MANIFEST)}
    env.pop("PYTHONPATH", None)
    if extras & {"server", "grpc"}:
        serve(bin_dir, env, tmp_path, grpc="grpc" in extras)
    if "lambda" in extras:  # the functions' modules, as the runtime interface client imports them
        code = "import functions.api.app, functions.batch.app; print('imported')"
        done = subprocess.run(
            [str(bin_dir / "python"), "-c", code],
            cwd=REPO,
            env={**env, "FNSERVE_RESULTS_TABLE": "t", "AWS_DEFAULT_REGION": "us-east-1"},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]
    if "cli" in extras:
        done = subprocess.run([str(bin_dir / "fnserve"), "--help"], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "serve" in done.stdout, done.stderr[-3000:]


def serve(bin_dir: Path, env: dict[str, str], tmp_path: Path, grpc: bool) -> None:
    """``fnserve serve`` really serving the demo models from the virtualenv (gRPC beside HTTP when installed)."""
    port = free_port()
    command = [str(bin_dir / "fnserve"), "serve", "--port", str(port)]
    if grpc:
        command += ["--grpc-port", str(free_port())]
    process, _ = start_http(command, port, tmp_path / "serve.log", env=env)
    process.terminate()
    process.wait(30)
