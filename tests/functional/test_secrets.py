"""The follow-up id key, read at run time from Secrets Manager (a real moto server), rotated without a redeploy."""

from __future__ import annotations

import pytest

from fnserve.adapters.keys import api_keys, key_id
from fnserve.aws import clients
from fnserve.aws.secrets import rotating_keys
from fnserve.bootstrap import followup_ids
from fnserve.core.errors import ConfigError
from fnserve.core.jobs.followups import FollowupIds
from fnserve.settings import Settings
from tests.helpers.clouds import Aws


def test_ids_are_signed_with_the_secret_and_survive_its_rotation(aws: Aws) -> None:
    sm = clients.client("secretsmanager")
    arn = sm.create_secret(Name="fnserve-result-id-key", SecretString="first-key")["ARN"]
    ids = FollowupIds(rotating_keys(arn, max_age=0))  # max_age 0: every call reads the secret again
    before = ids.mint("pending", "digits")
    assert FollowupIds(b"first-key").parse(before) is not None  # signed with the secret's value

    sm.put_secret_value(SecretId=arn, SecretString="second-key")  # rotated: the first is now AWSPREVIOUS
    after = ids.mint("pending", "digits")
    assert FollowupIds(b"second-key").parse(after) is not None
    assert FollowupIds(b"first-key").parse(after) is None
    assert ids.parse(before) is not None and ids.parse(after) is not None  # the previous key still verifies
    assert ids.parse("s" + before[1:]) is None  # a changed claim ("skipped") matches no key


def test_the_settings_name_the_secret_and_a_missing_one_stops_the_start(aws: Aws) -> None:
    arn = clients.client("secretsmanager").create_secret(Name="signing", SecretString="k3y")["ARN"]
    ids = followup_ids(Settings(results_table=aws.table, result_id_key_secret=arn))
    assert FollowupIds(b"k3y").parse(ids.mint("skipped", "digits")) is not None
    with pytest.raises(ConfigError, match="cannot read the follow-up id key from secret nope"):
        followup_ids(Settings(results_table=aws.table, result_id_key_secret="nope"))


def test_a_secrets_manager_outage_keeps_the_keys_read_before(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    arn = clients.client("secretsmanager").create_secret(Name="outage", SecretString="steady")["ARN"]
    keys = rotating_keys(arn, max_age=0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: every read fails
    clients.reset()
    assert list(keys()) == [b"steady"]


def test_api_keys_from_a_secret_survive_its_rotation(aws: Aws) -> None:
    sm = clients.client("secretsmanager")
    first, second = "fns-secret-one-0123456789", "fns-secret-two-0123456789"
    arn = sm.create_secret(Name="fnserve-api-keys", SecretString=f"{first}\n")["ARN"]
    keys = api_keys(Settings(api_keys_secret=arn))
    assert keys is not None and keys.caller(f"Bearer {first}") == key_id(first)
    assert keys.caller(f"Bearer {second}") is None

    sm.put_secret_value(SecretId=arn, SecretString=second)  # rotated: the first is now AWSPREVIOUS
    fresh = api_keys(Settings(api_keys_secret=arn))  # a process started after the rotation (or 5 minutes on)
    assert fresh is not None and fresh.caller(f"Bearer {second}") == key_id(second)
    assert fresh.caller(f"Bearer {first}") == key_id(first)  # clients still on the previous key get in


def test_an_unreadable_api_key_secret_stops_the_start(aws: Aws) -> None:
    with pytest.raises(ConfigError, match="cannot read the API keys from secret nope"):
        api_keys(Settings(api_keys_secret="nope"))
