"""The README's Python examples run as written (against a real server where they need one)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from tests.functional.conftest import start_server
from tests.helpers import DEMO_MANIFEST, REPO

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``fnserve serve`` on the demo manifest itself (its pipelines included), as ``make serve`` runs it."""
    log = tmp_path_factory.mktemp("readme") / "serve.log"
    proc, url = start_server(["-m", str(DEMO_MANIFEST), "--workers", "0", "--processes", "1"], log)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


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
    if "minilm-embed" in code or "digits-image" in code:  # the pipelines: the demo manifest's own server
        server = request.getfixturevalue("demo_server")
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

    from pydantic import TypeAdapter

    from fnserve.core.manifest import CascadeSettings, Manifest, PipelineSettings, Step

    blocks = [tomllib.loads(b) for b in re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)]
    manifests = {b["models"][0]["name"]: Manifest.model_validate(b) for b in blocks if "models" in b}
    manifest = manifests["digits-accurate"]
    assert manifest.models[0].cache_ttl_seconds == 3600
    assert manifest.models[0].inputs["input"].shape == [-1, 64]
    gpu = manifests["minilm"].models[0]  # the GPU section's: providers with their options
    assert [type(p).__name__ for p in gpu.execution_providers] == ["TensorrtProvider", "CudaProvider", "str"]
    assert gpu.batch_buckets[-1] == gpu.max_batch_size
    assert manifests["resnet50"].models[0].session_per_shape  # the CNN's: one session per batch shape
    cascades = [CascadeSettings.model_validate(c) for b in blocks for c in b.get("cascades", [])]
    assert [c.name for c in cascades] == ["digits"] and cascades[0].threshold == 0.65
    listed = [b["pipelines"] for b in blocks if isinstance(b.get("pipelines"), list)]
    pipelines = [PipelineSettings.model_validate(p) for entries in listed for p in entries]
    assert [p.name for p in pipelines] == ["minilm-embed"] and len(pipelines[0].pre) == 1
    # A step shown alone ([[pipelines.pre]] without its pipeline) must be a valid step too.
    alone = [b["pipelines"]["pre"] for b in blocks if isinstance(b.get("pipelines"), dict)]
    steps = [TypeAdapter(Step).validate_python(step) for entries in alone for step in entries]
    assert [step.step for step in steps] == ["custom"]
