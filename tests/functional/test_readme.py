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
    code: str,
    server: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "fnserve")
    code = code.replace("127.0.0.1:8080", server.removeprefix("http://"))
    if "127.0.0.1:8081" in code:  # the gRPC examples: a server with --grpc-port
        code = code.replace("127.0.0.1:8081", request.getfixturevalue("grpc_served").address)
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    if "print(" in code:
        assert capsys.readouterr().out.strip()
    if "handler = " in code:
        assert callable(namespace["handler"])
    assert os.getcwd() == str(REPO)


def test_readme_manifest_examples_are_valid() -> None:
    import tomllib

    from fnserve.core.manifest import CascadeSettings, Manifest

    blocks = [tomllib.loads(b) for b in re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)]
    models = next(b for b in blocks if "models" in b)
    manifest = Manifest.model_validate(models)
    assert manifest.models[0].cache_ttl_seconds == 3600
    assert manifest.models[0].inputs["input"].shape == [-1, 64]
    cascades = [CascadeSettings.model_validate(c) for b in blocks for c in b.get("cascades", [])]
    assert [c.name for c in cascades] == ["digits"] and cascades[0].threshold == 0.65
