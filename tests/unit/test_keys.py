"""API keys as a server holds them: where they come from, what a caller must send, what survives a bad read."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from unittest import mock

import pytest

from fnserve.adapters.keys import ApiKeys, api_keys, bearer, key_id, split_keys
from fnserve.core.errors import ConfigError
from fnserve.observability import logs
from fnserve.server.serve import _say_who_may_call
from fnserve.settings import Settings

KEY = "fns-unit-0123456789abcdef"


def test_the_bearer_token_in_any_case_and_nothing_else() -> None:
    assert bearer(f"Bearer {KEY}") == KEY.encode() == bearer(f"bearer  {KEY} ".encode())
    for value in (None, "", KEY, f"Basic {KEY}", "Bearer ", "Bearer"):
        assert bearer(value) is None


def test_keys_split_on_lines_and_commas() -> None:
    assert split_keys(" a ,b\r\n\nc\n") == ["a", "b", "c"]


def test_a_caller_is_named_by_its_key_id_never_its_key() -> None:
    keys = api_keys(Settings(api_keys=f"{KEY}, fns-other-0123456789abcdef"))
    assert keys is not None and keys.source == "FNSERVE_API_KEYS"
    assert keys.caller(f"Bearer {KEY}") == key_id(KEY) and len(key_id(KEY)) == 8 and key_id(KEY) not in KEY
    assert keys.caller("Bearer fns-other-0123456789abcdef") == key_id("fns-other-0123456789abcdef")
    assert keys.caller(f"Bearer {KEY}x") is None and keys.caller(None) is None
    assert KEY not in repr(Settings(api_keys=KEY))


def test_no_key_set_means_no_check_and_a_short_key_stops_the_start() -> None:
    assert api_keys(Settings()) is None
    with pytest.raises(ConfigError, match="fewer than 16 characters") as refused:
        api_keys(Settings(api_keys="short"))
    assert "short" not in refused.value.message.replace("fewer", "")  # named by its id, not itself
    with pytest.raises(ConfigError, match="holds no API key"):
        api_keys(Settings(api_keys=" , "))


def test_a_key_file_is_read_again_when_it_changes_and_a_bad_read_keeps_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    with pytest.raises(ConfigError, match="cannot read the API key file"):
        api_keys(Settings(api_keys_file=str(path)))
    path.write_text(KEY)
    with mock.patch("fnserve.adapters.keys.RECHECK_SECONDS", 0.0):
        keys = api_keys(Settings(api_keys_file=str(path)))
        assert keys is not None and keys.caller(f"Bearer {KEY}")
        path.write_text("fns-newer-0123456789abcdef\n")
        assert keys.caller(f"Bearer {KEY}") is None and keys.caller("Bearer fns-newer-0123456789abcdef")
        path.unlink()  # mid-replacement, or the volume gone: the keys read before still hold
        assert keys.caller("Bearer fns-newer-0123456789abcdef")
        path.write_text("tiny")  # a bad key written: refused, the keys before kept
        assert keys.caller("Bearer fns-newer-0123456789abcdef") and keys.caller("Bearer tiny") is None


def test_every_key_is_compared_whichever_matches() -> None:
    keys = ApiKeys(lambda: [KEY, "fns-second-0123456789abcdef"], "test")
    with mock.patch("fnserve.adapters.keys.hmac.compare_digest", wraps=__import__("hmac").compare_digest) as compared:
        assert keys.caller(f"Bearer {KEY}") == key_id(KEY)
    assert compared.call_count == 2


def test_the_start_log_says_who_may_call() -> None:
    handler = logs.logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    level, written = logs.logger.log_level, io.StringIO()
    logs.logger.setLevel("INFO")
    previous = handler.setStream(written)
    try:
        _say_who_may_call(Settings(), "0.0.0.0")
        assert "answers anyone who can reach 0.0.0.0" in written.getvalue()
        _say_who_may_call(Settings(api_keys=KEY), "0.0.0.0")
    finally:
        handler.setStream(previous)
        logs.logger.setLevel(level)
    out = written.getvalue()
    assert "API keys required" in out and key_id(KEY) in out and KEY not in out
