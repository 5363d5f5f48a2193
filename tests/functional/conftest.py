"""Functional fixtures: a real ``fnserve serve`` process on a free loopback port."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from fnserve.aws import clients as aws_clients
from tests.helpers import slow_model, write_test_manifest
from tests.moto import aws_env, free_port, moto_server
from tests.moto import reset as reset_moto
from tests.servers import start_server, wait_for

MAX_REQUEST_BYTES = 1 << 20


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


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    address: str  # gRPC host:port
    log: Path
    url: str  # HTTP


def serve_with_grpc(directory: Path, options: tuple[str, ...] = ("--workers", "1", "--processes", "1")) -> Served:
    """``fnserve serve --grpc-port`` on the test models, the demo cascade and a slow model."""
    manifest = write_test_manifest(directory, cascade=True)
    data = slow_model().SerializeToString()
    (directory / "slow.onnx").write_bytes(data)
    # One runtime call (one job in the worker) however many rows: no chunks of max_batch_size.
    slow = '[[models]]\nname = "slow"\npath = "slow.onnx"\nmax_batch_size = 100000\n'
    slow += f'sha256 = "{hashlib.sha256(data).hexdigest()}"\n'
    manifest.write_text(slow + manifest.read_text())
    port = free_port()
    log = directory / "serve.log"
    env = {**os.environ, "FNSERVE_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)}
    proc, url = start_server(["-m", str(manifest), "--grpc-port", str(port), *options], log, env=env, new_session=True)
    return Served(proc, f"127.0.0.1:{port}", log, url)


def stop(served: Served) -> None:
    if served.proc.poll() is None:
        os.killpg(served.proc.pid, signal.SIGTERM)
        served.proc.wait(timeout=60)


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


@dataclass
class Aws:
    """The AWS resources of one test, in a freshly reset moto server."""

    url: str
    table: str
    bucket: str
    queue_url: str
    dlq_url: str


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as url:
        yield url


def create_resources(table: str, bucket: str, queue: str) -> tuple[str, str]:
    """The results table (TTL on), the bucket, and a queue with its DLQ; returns (queue URL, DLQ URL)."""
    dynamodb = aws_clients.client("dynamodb")
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )
    aws_clients.client("s3").create_bucket(Bucket=bucket)
    sqs = aws_clients.client("sqs")
    dlq_url = sqs.create_queue(QueueName=f"{queue}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"})
    queue_url = sqs.create_queue(QueueName=queue, Attributes={"RedrivePolicy": redrive, "VisibilityTimeout": "30"})[
        "QueueUrl"
    ]
    return queue_url, dlq_url


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
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed: `make test` installs it (apt-get install redis-server)")
    port = free_port()
    directory = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(up, 10, "redis-server to answer")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Gcs:
    url: str  # STORAGE_EMULATOR_HOST
    bucket: str  # gs://payloads, created empty


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
