"""``fnserve local`` across restarts and edits: its embedded AWS emulator listens beside the gateway (its port + 1),
so the queue URLs and the submit and results lines it prints stay the same from one start to the next (a taken port
falls back to a free one); ``--reload`` names the files a reader changed, not hidden temporary ones."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import boto3
import pytest

from fnserve.emulator.resources import start_aws
from tests.servers import free_port


@pytest.fixture(autouse=True)
def _no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "LOCALSTACK_ENDPOINT", "FNSERVE_LOCALSTACK"):
        monkeypatch.delenv(key, raising=False)  # restored after the test, whatever start_aws set


def test_the_same_port_and_queue_urls_from_one_start_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    urls = []
    for _ in range(2):
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)  # a new `fnserve local`: no endpoint set yet
        endpoint, server = start_aws(port)
        try:
            assert endpoint == f"http://127.0.0.1:{port}"
            sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
            urls.append(sqs.create_queue(QueueName="jobs")["QueueUrl"])
        finally:
            server.stop()
    assert urls[0] == urls[1] and f":{port}/" in urls[0]


def test_a_taken_port_falls_back_to_a_free_one(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            endpoint, server = start_aws(taken)
        try:
            assert endpoint.startswith("http://127.0.0.1:") and not endpoint.endswith(f":{taken}")
            assert f"port {taken} is taken" in caplog.text
            sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
            assert sqs.create_queue(QueueName="elsewhere")["QueueUrl"].startswith(endpoint)
        finally:
            server.stop()


def test_reload_watches_what_a_reader_changes_not_hidden_temporary_files(tmp_path: Path) -> None:
    """``fnserve manifest add`` checks a hidden temporary manifest before it replaces the real one: the reload line
    must name the manifest, not ``.manifest.toml.new.toml``."""
    from watchfiles import Change

    from fnserve.emulator.emulator import reload_filter

    watch = reload_filter()
    assert watch(Change.modified, str(tmp_path / "models" / "manifest.toml"))
    assert watch(Change.added, str(tmp_path / "models" / "my-model" / "1" / "model.onnx"))
    assert not watch(Change.added, str(tmp_path / "models" / ".manifest.toml.new.toml"))
    assert not watch(Change.modified, str(tmp_path / "handler.py.swp"))  # watchfiles' own defaults still apply
