"""The Lambda functions' image (``infra/container/lambda.Dockerfile``), started from the image against the
Runtime API on loopback, as Lambda starts it: ENTRYPOINT, then the function's ImageConfig.Command, as a
user that is not root (Lambda runs images as one), with AWS_LAMBDA_RUNTIME_API set."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fnserve.aws import clients
from fnserve.emulator.runtime_api import RuntimeApi
from tests.helpers import REPO
from tests.helpers.clouds import create_resources
from tests.image.buildah import Built, started, unlocked
from tests.lambda_runtime import BUCKET, HANDLERS, TABLE, check_api, check_batch, check_init_error, function_env
from tests.moto import aws_env, moto_server

LAMBDA_USER = "993:990"  # any uid: Lambda's sandbox user is not root and owns nothing in the image


@pytest.fixture(scope="module")
def moto_url(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as url:
        for key, value in aws_env(url).items():
            monkeypatch_module.setenv(key, value)
        clients.reset()
        create_resources(TABLE, BUCKET, "image-jobs")
        yield url
    clients.reset()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@contextmanager
def function(image: Built, handler: str, moto_url: str, log: Path, **env: str) -> Iterator[RuntimeApi]:
    with RuntimeApi() as api:
        command = [*image.config["Entrypoint"], handler]  # what ImageConfig.Command replaces: the CMD
        environment = {**function_env(moto_url), "AWS_LAMBDA_RUNTIME_API": api.address, **env}
        with started(image.name, command, log, environment, user=LAMBDA_USER):
            yield api


def test_the_image_cmd_is_the_api_function(lambda_image: Built) -> None:
    assert lambda_image.config["Cmd"] == [HANDLERS["api"]]
    assert "FNSERVE_MANIFEST=/opt/models/manifest.toml" in lambda_image.config["Env"]


def test_the_api_function_in_the_image_answers_api_gateway(lambda_image: Built, moto_url: str, tmp_path: Path) -> None:
    with function(lambda_image, HANDLERS["api"], moto_url, tmp_path / "api.log") as api:
        check_api(api)


def test_the_batch_function_in_the_image_answers_sqs(lambda_image: Built, moto_url: str, tmp_path: Path) -> None:
    with function(lambda_image, HANDLERS["batch"], moto_url, tmp_path / "batch.log") as api:
        check_batch(api)


def test_the_image_without_its_manifest_reports_an_init_error(
    lambda_image: Built, moto_url: str, tmp_path: Path
) -> None:
    missing = {"FNSERVE_MANIFEST": "/opt/models/missing.toml"}
    with function(lambda_image, HANDLERS["api"], moto_url, tmp_path / "api.log", **missing) as api:
        check_init_error(api)


def test_the_image_holds_the_locked_versions(lambda_image: Built, tmp_path: Path) -> None:
    lock = REPO / "infra" / "container" / "lambda-requirements.lock"
    assert unlocked(lambda_image, "/opt/fnserve/bin/python", lock, tmp_path / "installed.log") == {}
