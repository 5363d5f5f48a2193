"""The API-key authorizer (ApiAuth=APIKEY) as Lambda runs it, against a real moto server's Secrets Manager: the
right key in, a wrong or missing one out, and a secret it cannot read refusing every caller, never letting one in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fnserve.adapters.keys import key_id
from fnserve.adapters.lambda_ import authorizer
from fnserve.aws import clients
from fnserve.aws.events import LambdaContext
from tests.helpers import REPO
from tests.helpers.clouds import Aws

KEY = "fns-deployed-0123456789abcdef"
SAMPLE = json.loads((REPO / "events" / "api-authorizer.json").read_text())


def event(authorization: str | None) -> dict[str, Any]:
    headers = {k: v for k, v in SAMPLE["headers"].items() if k != "authorization"}
    if authorization is not None:
        headers["authorization"] = authorization
    return {**SAMPLE, "headers": headers, "identitySource": [authorization] if authorization else []}


@pytest.fixture
def secret(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> str:
    arn = clients.client("secretsmanager").create_secret(Name="fnserve-api-keys", SecretString=KEY)["ARN"]
    monkeypatch.setenv("FNSERVE_API_KEYS_SECRET", arn)
    monkeypatch.setattr(authorizer, "_keys", None)  # a fresh container
    return str(arn)


def test_the_right_key_is_let_in_with_its_id_for_the_function(secret: str) -> None:
    answer = authorizer.handler(event(f"Bearer {KEY}"), LambdaContext())
    assert answer == {"isAuthorized": True, "context": {"keyId": key_id(KEY)}}


@pytest.mark.parametrize("authorization", [None, "", f"Bearer {KEY}x", KEY, f"Basic {KEY}"])
def test_a_wrong_or_missing_key_is_refused(secret: str, authorization: str | None) -> None:
    assert authorizer.handler(event(authorization), LambdaContext()) == {"isAuthorized": False}


def test_the_sample_event_carries_a_key_the_stack_does_not_hold(secret: str) -> None:
    assert authorizer.handler(SAMPLE, LambdaContext()) == {"isAuthorized": False}


def test_a_secret_it_cannot_read_refuses_everyone_until_it_can(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authorizer, "_keys", None)
    monkeypatch.setenv("FNSERVE_API_KEYS_SECRET", "fnserve-api-keys-later")
    assert authorizer.handler(event(f"Bearer {KEY}"), LambdaContext()) == {"isAuthorized": False}
    monkeypatch.delenv("FNSERVE_API_KEYS_SECRET")
    assert authorizer.handler(event(f"Bearer {KEY}"), LambdaContext()) == {"isAuthorized": False}  # none named
    clients.client("secretsmanager").create_secret(Name="fnserve-api-keys-later", SecretString=KEY)
    monkeypatch.setenv("FNSERVE_API_KEYS_SECRET", "fnserve-api-keys-later")
    assert authorizer.handler(event(f"Bearer {KEY}"), LambdaContext())["isAuthorized"] is True
