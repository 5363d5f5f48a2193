"""The README and the docs site (docs/*.md) run as written: their Python examples, curl lines and transcripts
(against a real server where they need one), and every other shell block names the test that proves it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest

from tests.helpers import DEMO_MANIFEST, REPO
from tests.helpers.docs import starts
from tests.servers import start_server

PAGES = {
    path.relative_to(REPO).as_posix(): path.read_text()
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
}
README = "\n".join(PAGES.values())  # every page, for what is looked for wherever it is written
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)


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
    if "minilm" in code or "digits-image" in code:  # MiniLM and the pipelines: the demo manifest's own server
        server = request.getfixturevalue("demo_server")
    code = code.replace("127.0.0.1:8080", server.removeprefix("http://"))
    if "127.0.0.1:8081" in code:  # the gRPC examples: a server with --grpc-port
        code = code.replace("127.0.0.1:8081", request.getfixturevalue("grpc_served").address)
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    if "huggingface_hub" in code:  # its clients share one session, which a script's exit would close
        huggingface_hub.close_session()
    if "print(" in code:
        assert capsys.readouterr().out.strip()
    if "handler = " in code:
        assert callable(namespace["handler"])
    assert os.getcwd() == str(REPO)


def test_readme_manifest_examples_are_valid() -> None:
    import tomllib

    import msgspec

    from fnserve.core.models.manifest.cascades import CascadeSettings
    from fnserve.core.models.manifest.loading import Manifest
    from fnserve.core.models.manifest.pipelines import EmbeddingSettings, PipelineSettings
    from fnserve.core.models.manifest.steps import Step

    blocks = [tomllib.loads(b) for b in re.findall(r"```toml\n(.*?)```", README, re.DOTALL)]
    for block in blocks:  # an entry shown without the sha256 that `fnserve manifest add` writes
        for model in block.get("models", []):
            model.setdefault("sha256", "0" * 64)
    manifests = {b["models"][0]["name"]: Manifest.validate(b) for b in blocks if "models" in b}
    manifest = manifests["digits-accurate"]
    assert manifest.models[0].cache_ttl_seconds == 3600
    assert manifest.models[0].inputs["input"].shape == [-1, 64]
    gpu = manifests["minilm"].models[0]  # the GPU section's: providers with their options
    assert [type(p).__name__ for p in gpu.execution_providers] == ["TensorrtProvider", "CudaProvider", "str"]
    assert gpu.batch_buckets[-1] == gpu.max_batch_size
    assert manifests["resnet50"].models[0].session_per_shape  # the CNN's: one session per batch shape
    cascades = [CascadeSettings.validate(c) for b in blocks for c in b.get("cascades", [])]
    assert [c.name for c in cascades] == ["digits"] and cascades[0].threshold == 0.65
    listed = [b["pipelines"] for b in blocks if isinstance(b.get("pipelines"), list)]
    pipelines = [PipelineSettings.validate(p) for entries in listed for p in entries]
    assert [p.name for p in pipelines] == ["minilm-embed"] and len(pipelines[0].pre) == 1
    # A step shown alone ([[pipelines.pre]] without its pipeline) must be a valid step too, and so must a
    # pipeline's embedding table shown alone.
    alone = [b["pipelines"].get("pre", []) for b in blocks if isinstance(b.get("pipelines"), dict)]
    steps = [msgspec.convert(step, Step) for entries in alone for step in entries]
    assert [step.step for step in steps] == ["custom", "custom"]  # pipelines.md's, and security.md's pinned one
    assert [step.sha256 is not None for step in steps] == [False, True]
    tables = [b["pipelines"]["embedding"] for b in blocks if "embedding" in b.get("pipelines", [])]
    assert [EmbeddingSettings.validate(t).dimensions for t in tables] == [[64, 128, 256]]


# The README's shell blocks. Each runs here against the demo server, or names where it is proven instead:
# a command the README adds must be run or accounted for, or this module fails.
SHELL = {
    f"{page}:{text.count(chr(10), 0, m.start()) + 1}": m.group(1)
    for page, text in PAGES.items()
    if page != "docs/quickstart.md"  # run block after block, its own model served, by test_quickstart.py
    for m in re.finditer(r"```(?:sh|bash)\n(.*?)```", text, re.DOTALL)
}
RUN_AGAINST_THE_DEMO_SERVER = "curl -s localhost:8080"  # the blocks run below, `make serve` being the fixture
ELSEWHERE = {  # a block's first command -> why it does not run here, and what proves it instead
    "make run": "the emulator with the demo: tests/e2e/test_local.py runs `fnserve local` on template.yaml",
    ".venv/bin/fnserve local": "the emulator's options: tests/e2e/test_local*.py",
    "docker run --rm -d -p 4566:4566 localstack/localstack": "needs Docker: FNSERVE_TEST_LOCALSTACK runs "
    "tests/e2e/test_local.py against it",
    "grpcurl": "not installed here; tests/functional/test_grpc.py makes the same reflection and health calls",
    "redis-server": "functions-framework with Redis: tests/functional/test_gcp.py runs both functions so",
    "infra/gcp/deploy.sh": "needs gcloud and a project; tests/functional/test_gcp.py checks its --dry-run",
    "aws cloudwatch get-metric-statistics": "needs a deployed stack: tests/functional/test_batch.py reads the line "
    "the batch function writes, its namespace, dimension and counts, and the page's table against them",
    "fnserve submit": "needs a queue: tests/functional/test_batch.py submits and fetches results on moto",
    "make sam-check": "make test runs sam-check; deploying needs an AWS account",
    "make deploy": "needs AWS credentials; make test runs sam-check, which builds, lints and runs what it deploys",
    "for policy in infra/aws/deployer/*.json;": "needs an account: tests/infra/test_deployer_policy.py checks the "
    "policies against the resources SAM makes of template.yaml, and each against IAM's size limit",
    'eval "$(.venv/bin/fnserve outputs)"': "needs a deployed stack: tests/functional/test_stack_outputs.py evaluates "
    "the exports of a stack with template.yaml's outputs that moto's CloudFormation made, and "
    "tests/functional/test_batch.py submits and fetches results on moto",
    "pip install awscurl": "needs a deployed stack with IAM authorization: tests/functional/test_lambda_http.py "
    "sends the same request through API Gateway's events",
    "aws sqs start-message-move-task": "needs a deployed stack: tests/e2e/test_local.py sends jobs to the dead-letter "
    "queue through the template's redrive policy on moto; the move back is SQS's own",
    "docker build -f infra/container/lambda.Dockerfile": "needs Docker (and ECR, an account): make image-test "
    "builds this Dockerfile with buildah and runs the image (tests/image/test_lambda_image.py)",
    ".venv/bin/fnserve models push": "tests/functional/test_publish.py pushes to moto and Cloud Storage",
    ".venv/bin/fnserve manifest add": "tests/functional/test_publish.py",
    ".venv/bin/fnserve quantize": "a usage line; the transcript below it runs in test_readme_transcripts_run",
    ".venv/bin/fnserve optimize": "a usage line; tests/unit/test_optimize.py runs the command, its refusals too",
    ".venv/bin/fnserve bench": "minutes of load: tests/functional/test_bench_cli.py runs a short sweep",
    ".venv/bin/python -m tests.bench.bench_memory": "a benchmark (its figures: docs/design/memory.md); "
    "tests/functional/test_request_memory.py holds every target's processes to the bound it measures",
    '.venv/bin/pip install ".[server,quantize]"': "make test-installs installs this set fresh and quantizes with it; "
    "then fnserve import of Hub-shaped folders: tests/functional/test_hub_import.py, the folders made in torch",
    "python3 -m venv .venv": "the extras page's install, the quickstart's: make test-installs installs exactly the "
    "quickstart's extras fresh and runs the quickstart and the README from them (tests/install/test_installs.py)",
    "python -m venv .venv-export": "make test makes .venv-export (make .venv-export/.installed); "
    "tests/functional/test_hub_import.py exports through it with --export-python",
    "export FNSERVE_API_KEYS_FILE=/etc/fnserve/keys": "tests/functional/test_api_keys.py runs fnserve serve with "
    "a key file and FNSERVE_API_KEYS, curl among its clients",
    "make perf-analyzer": "make test sets perf_analyzer up; tests/functional/test_perf_analyzer.py runs it against "
    "fnserve serve over HTTP and gRPC, on digits-accurate and on minilm-embed with --input-data",
}


def test_every_shell_block_runs_here_or_says_where_it_is_proven() -> None:
    for line, block in SHELL.items():
        if starts(block, "make serve") and RUN_AGAINST_THE_DEMO_SERVER in block:
            continue
        assert any(starts(block, command) for command in ELSEWHERE), f"{line}: {block.splitlines()[0]}"
    unused = [command for command in ELSEWHERE if not any(starts(b, command) for b in SHELL.values())]
    assert not unused, f"no block of the README or the docs starts with {unused}"


@pytest.mark.parametrize("line", [line for line, block in SHELL.items() if starts(block, "make serve")])
def test_readme_curl_examples_answer_as_shown(line: str, demo_server: str, tmp_path: Path) -> None:
    block = SHELL[line]
    script = "\n".join(block.splitlines()[1:]).replace("localhost:8080", demo_server.removeprefix("http://"))
    # Each curl's answer on its own line, so that each can be read back.
    script = script.replace("curl -s", "curl -s -w '\\n'")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(text) for text in done.stdout.splitlines() if text.strip()]
    # V2 answers, or OpenAI's lists of embeddings.
    assert answers and all(("outputs" in a or a.get("object") == "list") and "error" not in a for a in answers)
    # What the README's comments show of an answer (the first digit's label, the image's top 3, the tokens an
    # embedding request counted) is what came.
    shown = "".join(re.findall(r"^#\s+([{\"].*)$", block, re.MULTILINE)).replace(" ", "")
    got = json.dumps(answers, separators=(",", ":"))
    fragments = re.findall(r'\{"name":"\w+","datatype":"\w+","shape":\[[\d,]+\],"data":\[[^.\]]+\]', shown)
    fragments += re.findall(r'"usage":\{[^}]*\}', shown)
    assert fragments, f"{line} shows no answer to compare"
    for fragment in fragments:
        assert fragment in got, f"{line} shows {fragment}; the server answered {got[:300]}"


TRANSCRIPTS = re.findall(r"```\n\$ (fnserve (?:cascade tune|quantize) .*?)```", README, re.DOTALL)


@pytest.mark.parametrize("transcript", TRANSCRIPTS, ids=lambda t: t.split()[1])
def test_readme_transcripts_run_and_print_what_they_show(transcript: str, tmp_path: Path) -> None:
    command, _, shown = transcript.replace("\\\n", " ").partition("\n")
    (tmp_path / "layers").symlink_to(REPO / "layers")  # the README's relative paths; what it writes stays here
    fnserve = Path(sys.executable).with_name("fnserve")
    done = subprocess.run([str(fnserve), *shlex.split(command)[1:]], cwd=tmp_path, capture_output=True, text=True)
    printed = (done.stdout + done.stderr).splitlines()
    # Everything but timings: the same models and data give the same table, sizes and accuracies. A quantized
    # row's drift in a batch is its verdict only: its figure moves with the CPU's int8 kernels (VNNI or not).
    timed = ("latency", "error: the quantized model is confidently")
    for expected in shown.strip().splitlines():
        if expected.startswith("batch-invariant"):
            verdict = expected.partition("(")[0]
            assert any(line.startswith(verdict) for line in printed), f"README shows {expected!r}:\n" + "\n".join(
                printed
            )
        elif not expected.startswith(timed):
            assert expected in printed, f"README shows {expected!r}; fnserve printed:\n" + "\n".join(printed)


def test_what_the_readmes_batch_commands_write_is_ignored_by_git() -> None:
    """``--ids ids.txt``, ``-o out.jsonl`` and the like land where the reader runs them: the repository's root."""
    written = set(re.findall(r"(?:--ids|-o|>)\s+([\w.-]+\.(?:txt|jsonl|npz|npy))\b", README))
    assert {"ids.txt", "out.jsonl"} <= written, written
    ignored = subprocess.run(["git", "check-ignore", *sorted(written)], cwd=REPO, capture_output=True, text=True)
    assert set(ignored.stdout.split()) == written, f"not ignored: {written - set(ignored.stdout.split())}"
