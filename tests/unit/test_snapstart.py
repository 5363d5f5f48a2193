from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest

from fnserve.adapters.http import wire
from fnserve.adapters.lambda_ import snapstart
from fnserve.aws import clients


def test_after_restore_renews_clients_random_state_and_request_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    before_client = clients.client("sqs")
    before_prefix = wire._ID_PREFIX
    import random

    random.seed(7)
    snapshot_draw = random.random()
    random.seed(7)
    snapstart.after_restore()
    assert clients.client("sqs") is not before_client
    assert wire._ID_PREFIX != before_prefix
    assert random.random() != snapshot_draw


def test_register_hooks_in_only_where_the_runtime_offers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Callable[[], None]] = []
    fake = types.ModuleType("snapshot_restore_py")
    fake.register_after_restore = registered.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", fake)
    snapstart.register()
    assert registered == [snapstart.after_restore]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # import fails, as outside Lambda
    snapstart.register()
    assert registered == [snapstart.after_restore]
