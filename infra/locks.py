"""The lock files what fnserve ships installs from, compiled by uv from pyproject's ranges.

The library keeps ranges (users install it beside their own packages); the server images, the Lambda image, the
Lambda layer and the Cloud Functions install these exact versions, so what ``make image-test``, ``make sam-check``
and the tests ran is what ships, not whatever the index holds the day someone builds. ``make locks`` writes them
after a range changes; ``--check`` (tests/functional/test_locks.py) recompiles each against its committed self,
which uv keeps wherever pyproject still allows it, and fails when anything would change.

    python infra/locks.py            # write every lock
    python infra/locks.py --check    # exit 1, with the difference, where a lock is stale
    python infra/locks.py --check --root DIR    # another checkout's
    python infra/locks.py --check --only PATH   # one lock (its path, as LOCKS names it)
"""

from __future__ import annotations

import concurrent.futures
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"


@dataclass(frozen=True)
class Lock:
    """One lock: where it lives, the Python it is for (and every later one: markers where versions differ), what it
    holds (pyproject's requirements with ``extras``, and ``requirements`` beside them), and the lock whose versions
    it must agree with."""

    path: str
    python: str
    extras: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()
    constraints: str | None = None

    def compile(self, output: Path, root: Path = REPO) -> None:
        """Compile into ``output``, keeping the versions it already pins wherever they still fit."""
        command = [UV, "pip", "compile", "--quiet", "--universal", "--no-strip-markers", "--native-tls"]
        command += ["--python-version", self.python, "--custom-compile-command", "make locks", "-o", str(output)]
        if self.extras:
            command += ["pyproject.toml", *(f"--extra={extra}" for extra in self.extras)]
        if self.requirements:
            command.append("-")
        if self.constraints:
            command += ["-c", self.constraints]
        subprocess.run(command, cwd=root, input="\n".join(self.requirements), text=True, check=True, timeout=600)


LOCKS = [
    # The server image (infra/container/Dockerfile), CPU variant: its Python is the base image's.
    Lock("infra/container/requirements.lock", "3.11", extras=("server", "grpc", "aws", "redis")),
    # The CUDA variant's GPU runtime, at the version TensorRT 10 links to, and NVML for the GPU gauges, on the CPU
    # lock's versions.
    Lock(
        "infra/container/requirements-cuda.lock",
        "3.11",
        requirements=("onnxruntime-gpu[cuda,cudnn]==1.30.0", "nvidia-ml-py>=12"),
        constraints="infra/container/requirements.lock",
    ),
    # The Lambda image (infra/container/lambda.Dockerfile): the layer's set, boto3, the runtime interface client.
    Lock(
        "infra/container/lambda-requirements.lock", "3.11", extras=("lambda", "aws"), requirements=("awslambdaric>=3",)
    ),
    # The Cloud Functions' (infra/gcp/deploy.sh stages it beside fnserve's wheel).
    Lock("infra/gcp/requirements.lock", "3.11", extras=("gcp",)),
    # The Lambda layer (sam build reads it): Lambda's Python; boto3 comes with the runtime. Add "tracing" to its
    # extras for OpenTelemetry in the functions.
    Lock("layers/fnserve/requirements.txt", "3.12", extras=("lambda",)),
]


def difference(lock: Lock, root: Path) -> list[str]:
    """How ``lock`` at ``root`` differs from what it compiles to now, as a unified diff (empty: it is current)."""
    committed = root / lock.path
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / committed.name
        if committed.exists():
            shutil.copyfile(committed, fresh)
        lock.compile(fresh, root)
        before = committed.read_text().splitlines() if committed.exists() else []
        after = fresh.read_text().splitlines()
    return list(difflib.unified_diff(before, after, lock.path, "fresh"))


def main(check: bool, root: Path = REPO, only: str | None = None) -> int:
    """Write every lock of the checkout at ``root`` (or the one at ``only``), or (``check``) say which are stale."""
    stale = []
    chosen = [lock for lock in LOCKS if only is None or lock.path == only]
    if not chosen:
        print(f"no lock {only!r}: the locks are {', '.join(lock.path for lock in LOCKS)}", file=sys.stderr)
        return 2
    if not check:
        for lock in chosen:  # in order: a lock may be constrained by one before it
            lock.compile(root / lock.path, root)
        return 0
    # Each check compiles into a scratch copy against the committed locks: they may run at once, and uv spends
    # them mostly waiting on the index.
    with concurrent.futures.ThreadPoolExecutor(len(chosen)) as pool:
        differences = list(pool.map(lambda lock: difference(lock, root), chosen))
    for lock, lines in zip(chosen, differences, strict=True):
        if lines:
            stale.append(lock.path)
            sys.stdout.writelines(line + os.linesep for line in lines)
    if stale:
        print(f"stale against pyproject.toml: {', '.join(stale)}; run `make locks` and commit them", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    arguments = sys.argv[1:]

    def value(flag: str) -> str | None:
        return arguments[arguments.index(flag) + 1] if flag in arguments else None

    sys.exit(main("--check" in arguments, Path(value("--root") or REPO), value("--only")))
