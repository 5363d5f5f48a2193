"""Endpoints and retries as botocore's configuration chain decides them; LocalStack's when only it is named."""

from __future__ import annotations

import pytest

from fnserve.aws import clients


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS", "AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
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


def test_a_service_endpoint_beside_the_global_one_as_botocore_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")  # LocalStack
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:8000")  # DynamoDB Local
    monkeypatch.setenv("LOCALSTACK_HOST", "localhost")  # named too: the environment's endpoints still win
    assert clients.client("dynamodb").meta.endpoint_url == "http://127.0.0.1:8000"
    assert clients.client("sqs").meta.endpoint_url == "http://127.0.0.1:4566"
    assert clients.endpoint_url("dynamodb") == "http://127.0.0.1:8000"


def test_the_environments_retry_settings_hold_except_where_a_budget_bounds_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert clients.client("sqs").meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    clients.reset()
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    assert clients.client("sqs").meta.config.retries == {"mode": "adaptive", "total_max_attempts": 7}
    request_path = clients.client("dynamodb", clients.Budget(connect_timeout=0.2, read_timeout=0.2, max_attempts=2))
    assert request_path.meta.config.retries == {"mode": "standard", "total_max_attempts": 2}


def test_no_endpoint_means_aws_itself() -> None:
    assert clients.endpoint_url("sqs") is None
    assert "amazonaws.com" in clients.client("sqs").meta.endpoint_url


def test_clients_are_made_once_per_process() -> None:
    assert clients.client("sqs") is clients.client("sqs") is clients.client("sqs", clients.DEFAULT_BUDGET)
    first = clients.client("sqs")
    clients.reset()
    assert clients.client("sqs") is not first


def test_a_budget_bounds_every_call_of_its_client() -> None:
    quick = clients.Budget(connect_timeout=0.1, read_timeout=0.2, max_attempts=2)
    config = clients.client("dynamodb", quick).meta.config
    assert (config.connect_timeout, config.read_timeout) == (0.1, 0.2)
    assert config.retries == {"mode": "standard", "total_max_attempts": 2}
    assert clients.client("dynamodb", quick) is not clients.client("dynamodb")  # one client per budget


def test_a_local_emulator_needs_no_aws_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", f"{tmp_path}/none")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    sqs = clients.client("sqs")
    assert sqs.meta.region_name == clients.LOCAL_REGION
    assert sqs._request_signer._credentials is not None
    clients.reset()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://sqs.example.com")  # not local: nothing is made up
    with pytest.raises(Exception, match="region"):
        clients.client("sqs")


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize(
    ("error", "kind", "says"),
    [
        (_client_error("NoSuchKey", 404), "InvalidInput", "does not exist"),
        (_client_error("AccessDenied", 403), "InvalidInput", "access denied"),
        (_client_error("ValidationException", 400), "InvalidInput", "ValidationException"),
        (_client_error("ProvisionedThroughputExceededException", 400), "StoreUnavailable", "try again"),
        (_client_error("SlowDown", 503), "StoreUnavailable", "try again"),
        (_client_error("Whatever", 500), "StoreUnavailable", "try again"),
        (ConnectionRefusedError("refused"), "StoreUnavailable", "it cannot be reached"),
    ],
)
def test_store_errors_say_whose_fault_they_are(error: Exception, kind: str, says: str) -> None:
    mapped = clients.store_error(error, "reading s3://b/k")
    assert type(mapped).__name__ == kind and says in mapped.message and "reading s3://b/k" in mapped.message
    assert (mapped.status_code < 500) == (kind == "InvalidInput")


def test_store_errors_keep_botocore_timeouts_and_invalid_parameters_apart() -> None:
    from botocore.exceptions import ParamValidationError, ReadTimeoutError

    invalid = clients.store_error(ParamValidationError(report="Invalid bucket name"), "reading s3://bad!/k")
    assert invalid.status_code == 422 and "Invalid bucket name" in invalid.message
    stalled = clients.store_error(ReadTimeoutError(endpoint_url="http://x"), "reading results")
    assert stalled.status_code == 503 and stalled.retry_after == 1
    assert stalled.message == "reading results: it did not answer in time, try again later"
