"""What S3's answer to a HeadObject tells ``fnserve models push`` of a key, with the answers injected by botocore's
Stubber: S3 refuses a missing key with a 403 to a caller without s3:ListBucket, which moto does not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from fnserve.aws import clients
from fnserve.stores import s3

URI = "s3://models/digits/1/model.onnx"
STUB_ENV = {
    "AWS_ENDPOINT_URL": "http://stub",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "x",
    "AWS_SECRET_ACCESS_KEY": "x",
}


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    """The process's S3 client, stubbed: nothing leaves it."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for key, value in STUB_ENV.items():
        monkeypatch.setenv(key, value)
    clients.reset()
    with Stubber(clients.client("s3")) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()
    clients.reset()


@pytest.mark.parametrize("status", [403, 404])
def test_a_key_that_is_missing_or_hidden_is_not_known_to_be_there(head: Stubber, status: int) -> None:
    # A HeadObject's error has no body: botocore names it by its status.
    head.add_client_error("head_object", service_error_code=str(status), http_status_code=status)
    assert s3.stored_sha256(URI) is None


def test_the_sha256_recorded_is_read_and_any_other_failure_raised(head: Stubber) -> None:
    head.add_response("head_object", {"Metadata": {"sha256": "ab" * 32}}, {"Bucket": "models", "Key": URI[12:]})
    assert s3.stored_sha256(URI) == "ab" * 32
    head.add_client_error("head_object", service_error_code="503", http_status_code=503)
    with pytest.raises(ClientError):
        s3.stored_sha256(URI)
