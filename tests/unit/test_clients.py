"""Every client goes to one endpoint: AWS_ENDPOINT_URL, else LocalStack's, else AWS."""

from __future__ import annotations

import pytest

from fnserve.aws import clients


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("LOCALSTACK_HOST", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    clients.reset()


@pytest.mark.parametrize("service", ["sqs", "dynamodb", "s3"])
def test_aws_endpoint_url_takes_every_service(monkeypatch: pytest.MonkeyPatch, service: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.setenv("LOCALSTACK_HOST", "elsewhere:4566")  # the explicit endpoint wins
    assert clients.endpoint_url(service) == "http://127.0.0.1:5000"
    assert clients.client(service).meta.endpoint_url == "http://127.0.0.1:5000"


@pytest.mark.parametrize(
    ("host", "url"), [("localstack:4566", "http://localstack:4566"), ("localhost", "http://localhost:4566")]
)
def test_localstack_host_follows_localstack_client(monkeypatch: pytest.MonkeyPatch, host: str, url: str) -> None:
    monkeypatch.setenv("LOCALSTACK_HOST", host)
    for service in ("sqs", "dynamodb", "s3"):
        assert clients.endpoint_url(service) == url


def test_no_endpoint_means_aws_itself() -> None:
    assert clients.endpoint_url("sqs") is None
    assert "amazonaws.com" in clients.client("sqs").meta.endpoint_url


def test_clients_are_made_once_per_process() -> None:
    assert clients.client("sqs") is clients.client("sqs")
    first = clients.client("sqs")
    clients.reset()
    assert clients.client("sqs") is not first
