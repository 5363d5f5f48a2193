"""Images built and started here without a Docker engine: Debian's buildah, on a base made by debootstrap.

buildah builds a Dockerfile as root with ``--isolation chroot`` on the ``vfs`` storage driver (no
overlay, no user namespaces), and ``buildah run --isolation chroot`` starts a command in the built
image on the host's network, so a test reaches it on 127.0.0.1. Registries of base images cannot be
reached from every machine, so the base is a Debian made here by ``debootstrap`` and the Dockerfiles
take it (and its Python) as build arguments.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fnserve.emulator.images import BUILDAH, Container, buildah, image_exists
from tests.helpers import REPO

SUITE = "bookworm"
BASE = f"localhost/fnserve-base:{SUITE}"
BASE_PYTHON = "python3.11"  # bookworm's
MIRROR = "http://deb.debian.org/debian"


def ensure_base() -> str:
    """The Debian base image (kept between runs): minbase bookworm with its Python, as a Lambda or
    Ubuntu base would have one."""
    if image_exists(BASE):
        return BASE
    root = Path(tempfile.mkdtemp(prefix="fnserve-debootstrap-"))
    try:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=ca-certificates,python3,python3-venv",
                SUITE,
                str(root),
                MIRROR,
            ],
            check=True,
            capture_output=True,
        )
        container = buildah("from", "scratch")
        try:
            buildah("copy", container, str(root), "/")
            buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", container)
            buildah("commit", "--quiet", container, BASE)
        finally:
            buildah("rm", container)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BASE


@dataclass(frozen=True)
class Built:
    name: str
    seconds: float
    size_mb: float
    config: dict[str, Any]  # the image's Docker config: Env, User, Entrypoint, Cmd, Healthcheck, ...


def build(dockerfile: Path, tag: str, args: Mapping[str, str], log: Path) -> Built:
    """``buildah bud`` the Dockerfile with the repository as its context; docker format keeps HEALTHCHECK.

    A build leaves nothing behind but the image: the image the tag named before is removed first, and the build's
    containers after it, failed or not (buildah 1.28 keeps the container of a stage that is the base unchanged, as
    ``runtime-cpu`` is, and its ``--force-rm`` removes the base image itself). With vfs storage every image and
    container is a full copy of its files (3 GB for the CUDA variant): kept, they filled the disk in a few runs."""
    if image_exists(tag):
        remove_image(tag)
    command = [*BUILDAH, "bud", "--isolation", "chroot", "--format", "docker", "--layers=false"]
    command += ["-f", str(dockerfile)]
    command += _trusted_ca(log.parent)
    for key, value in args.items():
        command += ["--build-arg", f"{key}={value}"]
    before = _containers()
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run([*command, "-t", tag, str(REPO)], stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    left = _containers() - before
    if left:
        subprocess.run([*BUILDAH, "rm", *left], capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {dockerfile.name} failed ({done.returncode}):\n{log.read_text()[-6000:]}")
    inspected = json.loads(buildah("inspect", "--type", "image", tag))
    config = inspected["Docker"]["config"]
    manifest = inspected["Manifest"]
    layers = (json.loads(manifest) if isinstance(manifest, str) else manifest)["layers"]
    size = sum(layer["size"] for layer in layers)  # uncompressed: what the image takes on a host's disk
    return Built(tag, seconds, size / 1e6, config)


def _containers() -> set[str]:
    return set(buildah("containers", "--quiet", "--notruncate").split())


def remove_image(image: str) -> None:
    """Remove an image from local storage (its containers first: a test's container of it that outlived a killed
    run); a failure is reported, not raised: cleaning up must not fail the tests it follows."""
    done = subprocess.run([*BUILDAH, "rmi", "--force", image], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"could not remove image {image}: {done.stderr.strip()[-500:]}")


def _trusted_ca(scratch: Path) -> list[str]:
    """The host's CA bundle, for pip in the build's RUN steps (a machine behind a TLS proxy: the base's own bundle
    does not know the proxy's CA); mounted for the build, never kept in the image."""
    named = (os.environ.get(name) for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"))
    # Else the system's bundle (which a proxy's CA joins through update-ca-certificates).
    bundle = next((path for path in named if path), SYSTEM_CA)
    if not Path(bundle).is_file():
        return []
    config = scratch / "pip.conf"
    config.write_text(f"[global]\ncert = {BUILD_CA}\n")
    return ["--volume", f"{bundle}:{BUILD_CA}:ro", "--volume", f"{config}:/etc/pip.conf:ro"]


BUILD_CA = "/etc/fnserve-build-ca.crt"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


@dataclass
class Running:
    """A command started inside an image's container (fnserve local's own :class:`Container`)."""

    container: Container
    log: Path

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.container.process is not None
        return self.container.process

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def exec(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run another command in the same container (a HEALTHCHECK, say), as the image's user."""
        return self.container.exec(command)


@contextmanager
def started(
    image: str,
    command: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    volumes: Mapping[Path, str] | None = None,
    user: str | None = None,
) -> Iterator[Running]:
    """``command`` running in a new container of ``image`` (the image's environment and working directory, its
    user unless ``user`` says another), stopped and removed at the end of the block."""
    with log.open("wb") as out:
        mounts = {str(host): inside for host, inside in (volumes or {}).items()}
        container = Container(image, command, env or {}, user, mounts, output=out).start()
        try:
            yield Running(container, log)
        finally:
            container.stop()


INSTALLED = (
    "import importlib.metadata as m, json, platform; print(json.dumps([platform.python_version(), "
    "{d.metadata['Name']: d.version for d in m.distributions()}]))"
)


def unlocked(image: Built, python: str, lock: Path, log: Path) -> dict[str, tuple[str, str | None]]:
    """What ``image`` holds at another version than ``lock`` pins for its Python: name -> (locked, installed).
    ``python``: the image's interpreter, run as its user with its environment."""
    with started(image.name, [python, "-c", INSTALLED], log) as running:
        assert running.process.wait(120) == 0, running.output()
    version, installed = json.loads(running.output().strip().splitlines()[-1])
    have = {canonicalize_name(name): found for name, found in installed.items()}
    differ: dict[str, tuple[str, str | None]] = {}
    for line in lock.read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"python_full_version": version}):
            continue
        pinned = next(iter(requirement.specifier)).version
        if have.get(canonicalize_name(requirement.name)) != pinned:
            differ[requirement.name] = (pinned, have.get(canonicalize_name(requirement.name)))
    return differ
