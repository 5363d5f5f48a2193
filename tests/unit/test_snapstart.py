from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest

from fnserve.adapters.lambda_ import snapstart
from fnserve.aws import clients
from fnserve.core.models import registry as registry_module
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.registry import ModelRegistry
from fnserve.observability import request_meta
from tests.helpers import DEMO_MANIFEST


def test_after_restore_renews_clients_random_state_and_request_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    before_client = clients.client("sqs")
    before_prefix = request_meta._ID_PREFIX
    import random

    random.seed(7)
    snapshot_draw = random.random()
    random.seed(7)
    snapstart.after_restore()
    assert clients.client("sqs") is not before_client
    assert request_meta._ID_PREFIX != before_prefix
    assert random.random() != snapshot_draw


def test_register_hooks_in_only_where_the_runtime_offers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry(load_manifest(DEMO_MANIFEST))
    before: list[Callable[[], None]] = []
    after: list[Callable[[], None]] = []
    fake = types.ModuleType("snapshot_restore_py")
    fake.register_before_snapshot = before.append  # type: ignore[attr-defined]
    fake.register_after_restore = after.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", fake)
    snapstart.register(registry)
    assert before == [registry.warm_all] and after == [snapstart.after_restore]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # import fails, as outside Lambda
    snapstart.register(registry)
    assert len(before) == 1 and len(after) == 1


def test_before_the_snapshot_every_model_is_loaded_and_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry(load_manifest(DEMO_MANIFEST))
    names = registry.names()
    assert not any(registry.is_loaded(name) for name in names)  # Lambda loads lazily
    runs: list[str] = []
    real = registry_module.warm_up

    def counted(
        session: object, settings: object, inputs: object, outputs: object, placement: object, where: str
    ) -> None:
        runs.append(where)
        real(session, settings, inputs, outputs, placement, where)  # type: ignore[arg-type]

    monkeypatch.setattr(registry_module, "warm_up", counted)
    registry.warm_all()
    assert all(registry.is_loaded(name) for name in names)
    # Loaded models are run again, once each, whatever their manifest's warmup setting says.
    runs.clear()
    registry.warm_all()
    expected = [f"model {name!r} version {version!r}" for name in names for version in registry.versions(name)]
    assert sorted(runs) == sorted(expected)
