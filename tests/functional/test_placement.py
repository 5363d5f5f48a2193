"""Model placement: the manifest's worker groups, each holding its models and no other."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tomli_w
from msgspec import ValidationError

from fnserve.core.models.manifest.loading import Manifest, load_manifest
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.servers import start_server

DIGITS = np.load(DEMO_HOLDOUT)["input"]


def models(*names: str) -> list[dict[str, object]]:
    import tomllib

    demo = {m["name"]: m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"]}
    return [{**demo[name], "path": str(DEMO_MANIFEST.parent / demo[name]["path"])} for name in names]


def write(directory: Path, groups: list[dict[str, object]]) -> Path:
    manifest = directory / "manifest.toml"
    manifest.write_text(tomli_w.dumps({"models": models("digits-fast", "digits-accurate"), "groups": groups}))
    return manifest


def test_worker_groups_are_checked_against_the_manifest(tmp_path: Path) -> None:
    base = {"models": models("digits-fast", "digits-accurate")}
    for groups, message in (
        ([{"name": "a", "models": ["nope"]}], "worker group 'a': model 'nope' is not in the manifest"),
        (
            [{"name": "a", "models": ["digits-fast"]}, {"name": "b", "models": ["digits-fast"]}],
            "model 'digits-fast' is in two worker groups: 'a' and 'b'",
        ),
        (
            [{"name": "a", "models": ["digits-fast"]}, {"name": "a", "models": ["digits-accurate"]}],
            "worker group 'a' is listed twice",
        ),
        ([{"name": "a", "models": []}], "models"),
        ([{"name": "a", "workers": 0, "models": ["digits-fast"]}], "workers"),
    ):
        with pytest.raises(ValidationError, match=message):
            Manifest.validate({**base, "groups": groups})
    manifest = load_manifest(write(tmp_path, [{"name": "accurate", "workers": 2, "models": ["digits-accurate"]}]))
    held = manifest.holding("accurate")  # what the group's workers load
    assert [m.name for m in held.models] == ["digits-accurate"] and not held.groups
    assert manifest.group_of("digits-fast") is None and manifest.group_of("digits-accurate").workers == 2  # type: ignore[union-attr]


def test_a_group_s_models_run_in_its_workers_alone_and_the_others_in_the_front_process(tmp_path: Path) -> None:
    manifest = write(tmp_path, [{"name": "accurate", "workers": 2, "models": ["digits-accurate"]}])
    log = tmp_path / "serve.log"
    proc, url = start_server(["-m", str(manifest)], log, new_session=True)
    try:
        body = {
            "inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": DIGITS[:2].ravel().tolist()}]
        }
        for name in ("digits-fast", "digits-accurate"):
            response = httpx.post(f"{url}/v2/models/{name}/infer", json=body)
            assert response.status_code == 200, response.text
        placed = httpx.get(f"{url}/v2/models/digits-accurate").json()["parameters"]
        assert placed["worker_group"] == "accurate" and placed["workers"] == 2
        assert "worker_group" not in httpx.get(f"{url}/v2/models/digits-fast").json()["parameters"]
        config = httpx.get(f"{url}/v2/models/digits-accurate/config").json()
        assert config["instance_group"] == [{"name": "cpu", "kind": "KIND_CPU", "count": 2}]
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        workers = [pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(workers) == 2  # the group's; the front process runs digits-fast itself
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text()
    # Each model loaded where it runs, and only there: digits-accurate in its two workers, never in the front.
    assert text.count("loaded model 'digits-accurate'") == 2 and text.count("loaded model 'digits-fast'") == 1
    assert "worker groups 'accurate': 2 worker(s) holding digits-accurate" in text
    assert "accurate in 2 worker(s)" in text  # the banner


def test_groups_name_their_own_workers_and_models_shows_them(tmp_path: Path) -> None:
    manifest = write(tmp_path, [{"name": "accurate", "models": ["digits-accurate"]}])
    refused = subprocess.run(
        [sys.executable, "-m", "fnserve", "serve", "-m", str(manifest), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1
    assert "places models in worker groups ([[groups]]), which name their own workers" in refused.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "fnserve", "models", "-m", str(manifest)], capture_output=True, text=True, timeout=120
    )
    assert "digits-accurate  versions 1  in worker group 'accurate' (1 worker(s))" in listed.stdout
    assert "digits-fast  versions 1\n" in listed.stdout
