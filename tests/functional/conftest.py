"""Functional fixtures: a real ``fnserve serve`` process on a free loopback port."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fnserve.aws import clients as aws_clients
from tests.helpers import write_test_manifest
from tests.helpers.clouds import Aws, Gcs, create_resources
from tests.helpers.serving import MAX_REQUEST_BYTES, Served, serve_with_grpc, stop
from tests.moto import aws_env, free_port
from tests.moto import reset as reset_moto
from tests.servers import start_server


@pytest.fixture(scope="session")
def test_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_manifest(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def server(test_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running server with the demo models and the all-datatypes identity model."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "FNSERVE_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)}
    proc, url = start_server(["-m", str(test_manifest)], log, env=env)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture(scope="session")
def grpc_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with HTTP and gRPC, one inference worker, the test models, the demo cascade and a slow model."""
    served = serve_with_grpc(tmp_path_factory.mktemp("grpc"))
    yield served
    stop(served)


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=10) as c:
        yield c


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    reset_moto(moto_url)
    for key, value in aws_env(moto_url).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LOCALSTACK_HOST", raising=False)
    aws_clients.reset()
    queue_url, dlq_url = create_resources("fnserve-results", "fnserve-payloads", "fnserve-jobs")
    yield Aws(moto_url, "fnserve-results", "fnserve-payloads", queue_url, dlq_url)
    aws_clients.reset()


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """What fnserve's Powertools logger writes (its handler bound stdout at import)."""
    from fnserve.observability.logs import logger

    stream = io.StringIO()
    handler = logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    old = handler.setStream(stream)
    yield stream
    handler.setStream(old)


@pytest.fixture(scope="session")
def gcs() -> Iterator[Gcs]:
    """A Cloud Storage server (gcp-storage-emulator: its JSON API, in memory) on a free loopback port."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="payloads")
    server.start()
    url = f"http://127.0.0.1:{port}"
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = url  # this process's clients too
    try:
        yield Gcs(url, "gs://payloads")
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous
