"""The images fnserve ships, built from their Dockerfiles by buildah (``make image-test``), once a session.

Each image is built on the debootstrapped Debian base with its Python as build arguments; the
build's time and the image's size are printed at the end of the run. The server images (gigabytes of vfs copies)
are removed when the session ends; the base stays (it is the cache), and so does the Lambda image, which
``bench_lambda_image`` starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.helpers import REPO
from tests.image.buildah import BASE_PYTHON, Built, build, ensure_base, remove_image

BUILT: list[Built] = []


def _build(
    tmp_path_factory: pytest.TempPathFactory, dockerfile: str, tag: str, keep: bool = False, **args: str
) -> Iterator[Built]:
    if shutil.which("buildah") is None or shutil.which("debootstrap") is None:
        pytest.fail("make image-test needs Debian's buildah and debootstrap (apt-get install buildah debootstrap)")
    base = ensure_base()
    log = tmp_path_factory.mktemp("build") / f"{tag.rsplit(':', 1)[-1]}.log"
    built = build(REPO / "infra" / "container" / dockerfile, tag, {"BASE": base, "PYTHON": BASE_PYTHON, **args}, log)
    BUILT.append(built)
    yield built
    if not keep:
        remove_image(tag)


@pytest.fixture(scope="session")
def server_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The CPU variant of the server image with the demo models baked in."""
    yield from _build(
        tmp_path_factory, "Dockerfile", "localhost/fnserve:cpu-test", VARIANT="cpu", MODELS="layers/models/models"
    )


@pytest.fixture(scope="session")
def cuda_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The CUDA variant (onnxruntime-gpu with pip's CUDA and cuDNN), the demo models baked in."""
    models = "layers/models/models"
    yield from _build(tmp_path_factory, "Dockerfile", "localhost/fnserve:cuda-test", VARIANT="cuda", MODELS=models)


@pytest.fixture(scope="session")
def lambda_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """The Lambda functions' image, the demo models baked in."""
    yield from _build(tmp_path_factory, "lambda.Dockerfile", "localhost/fnserve-lambda:test", keep=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for built in BUILT:
        terminalreporter.write_line(f"image {built.name}: built in {built.seconds:.0f} s, {built.size_mb:.0f} MB")
