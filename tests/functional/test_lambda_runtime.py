"""The image functions' entrypoint (``python -m awslambdaric HANDLER``) against the Runtime API on loopback.

What ``infra/container/lambda.Dockerfile`` starts, run from the dev environment: the runtime interface
client polls :class:`RuntimeApi` for real-shaped API Gateway and SQS events, and posts the handlers'
answers and errors back. ``make image-test`` runs the same checks against the built image.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from fnserve.aws import clients
from fnserve.core.jobs.results import job_key
from fnserve.emulator.runtime_api import RuntimeApi
from fnserve.stores.dynamodb import DynamoResultStore
from tests.helpers import DEMO_MANIFEST, REPO
from tests.helpers.clouds import Aws, create_resources
from tests.lambda_runtime import (
    BUCKET,
    HANDLERS,
    TABLE,
    check_api,
    check_batch,
    check_init_error,
    event,
    function_env,
)
from tests.moto import reset


@contextmanager
def function(handler: str, moto_url: str, log: Path, api: RuntimeApi | None = None, **env: str) -> Iterator[RuntimeApi]:
    """The runtime interface client serving ``handler`` from the repository, as the image lays it out."""
    with api or RuntimeApi() as api, log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "awslambdaric", handler],
            cwd=REPO,  # the image's WORKDIR holds functions/ the same way
            env={
                **os.environ,
                **function_env(moto_url),
                "FNSERVE_MANIFEST": str(DEMO_MANIFEST),
                "AWS_LAMBDA_RUNTIME_API": api.address,
                **env,
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield api
        finally:
            process.kill()
            process.wait(30)


@pytest.fixture
def resources(aws: Aws) -> Aws:
    reset(aws.url)
    clients.reset()
    create_resources(TABLE, BUCKET, "image-jobs")
    return aws


def test_the_api_function_answers_api_gateway_events_through_the_runtime_api(resources: Aws, tmp_path: Path) -> None:
    with function(HANDLERS["api"], resources.url, tmp_path / "api.log") as api:
        check_api(api)


def test_the_batch_function_answers_an_sqs_event_through_the_runtime_api(resources: Aws, tmp_path: Path) -> None:
    with function(HANDLERS["batch"], resources.url, tmp_path / "batch.log") as api:
        check_batch(api)


def test_a_function_without_its_manifest_reports_an_init_error(resources: Aws, tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "manifest.toml")
    with function(HANDLERS["api"], resources.url, tmp_path / "api.log", FNSERVE_MANIFEST=missing) as api:
        check_init_error(api)


def test_the_runtime_api_refuses_what_is_not_its_protocol() -> None:
    with RuntimeApi() as api:
        base = f"http://{api.address}/2018-06-01/runtime"
        with pytest.raises(ValueError, match="must be JSON"):
            api.invoke({"body": b"bytes are not JSON"})
        unknown = httpx.post(f"{base}/invocation/no-such-id/response", content=b"{}")
        assert unknown.status_code == 400 and unknown.json()["errorType"] == "InvalidRequestID"
        assert httpx.get(f"{base}/nowhere").status_code == 404
        with pytest.raises(TimeoutError, match="no answer"):
            api.invoke({}, timeout=0.2)  # no runtime polls: the caller is told, never left waiting


def test_an_event_whose_caller_gave_up_never_reaches_the_function(resources: Aws, tmp_path: Path) -> None:
    """Lambda does not run an invocation that timed out before a runtime took it; nor does the local one."""
    jobs = event("batch-jobs.json")
    stale = {"Records": [jobs["Records"][0]]}  # job example-0, which the function would store
    later = {"Records": [jobs["Records"][1]]}
    with RuntimeApi() as api:
        with pytest.raises(TimeoutError):
            api.invoke(stale, timeout=0.05)  # no runtime is polling yet
        with function(HANDLERS["batch"], resources.url, tmp_path / "batch.log", api=api):
            assert api.invoke(later, timeout=120) == {"batchItemFailures": []}
    # The runtime takes events in order: had it been given the stale one, it would have stored it first.
    stored = DynamoResultStore(TABLE, bucket=BUCKET).get([job_key("example-0"), job_key("example-1")])
    assert set(stored) == {job_key("example-1")}
