"""The README's Python examples run as written (against a real server where they need one)."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import DEMO_MANIFEST, REPO

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("code", BLOCKS)
def test_readme_python_example_runs(
    code: str, server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "fnserve")
    code = code.replace("127.0.0.1:8080", server.removeprefix("http://"))
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    if "print(" in code:
        assert capsys.readouterr().out.strip()
    if "handler = " in code:
        assert callable(namespace["handler"])
    assert os.getcwd() == str(REPO)


def test_readme_manifest_example_is_a_valid_manifest() -> None:
    import tomllib

    from fnserve.core.settings import Manifest

    (block,) = re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    manifest = Manifest.model_validate(tomllib.loads(block))
    assert manifest.models[0].cache_ttl_seconds == 3600
    assert manifest.models[0].inputs["input"].shape == [-1, 64]
