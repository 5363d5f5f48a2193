"""What a user's ``pip install`` gets works: each extra set users install, in a fresh virtualenv, at the lowest
versions pyproject's ranges allow and at the latest, runs what the extra is for.

The sets are the ones users install (each extra alone), every set an install instruction names (the README's
and the docs' ``pip install 'fnserve[...]'``) and every set the images and the layer lock (infra/locks.py), read
from those files, so a new one is tested as soon as it is written. "lowest": every direct requirement of the set at the
lowest version its range allows that resolves with the others (uv's ``--resolution lowest-direct``), the rest
latest; "highest": what pip resolves today. The newest ``tritonclient[all]`` is installed beside fnserve every
time, as our docs recommend it as the client: it pins protobuf and grpcio of its own, which is how a range that
fnserve's stubs do not fit used to reach users. Each supported Python runs one set's smoke too (the full suite
runs on the default one).

The virtualenvs are made by uv (from its cache, in seconds; the system's trust store, as pip's, for a machine
behind a TLS proxy). GPU-only extras are left out: their wheels need a GPU machine (``make test-gpu``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import numpy as np
import pytest
from packaging.requirements import Requirement

from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, PROJECT, REPO, documented, load_module, requirements
from tests.helpers.docs import install_extras, reader_dir, run_block, run_quickstart, servers_stopped, sh_blocks, starts
from tests.moto import aws_env, free_port, reset
from tests.servers import start_http

UV = str(Path(sys.executable).parent / "uv")
# What users install one by one (the README's and the docs' extras), beside the documented sets below.
ALONE = ["server", "grpc", "aws", "gcp", "redis", "lambda", "local"]  # local: what make run installs
# Each supported Python (pyproject's classifiers) beside the one the suite runs on, with the set it smokes.
PYTHONS = sorted(
    c.rsplit(" :: ", 1)[1]
    for c in PROJECT["classifiers"]
    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
)


def shipped() -> set[frozenset[str]]:
    """The extra sets the images and the Lambda layer install, from their locks (infra/locks.py)."""
    locks = load_module(REPO / "infra" / "locks.py", "locks")
    return {frozenset(lock.extras) for lock in locks.LOCKS if lock.extras}


SETS = sorted(
    {frozenset([extra]) for extra in ALONE} | set(documented()) | shipped(), key=lambda s: (len(s), sorted(s))
)


@pytest.fixture(scope="session")
def tritonclient() -> str:
    """The newest tritonclient[all] the index has for this Python, pinned, so a lowest resolution keeps it newest."""
    done = subprocess.run(
        [UV, "pip", "compile", "--quiet", "--native-tls", "--no-header", "--python", sys.executable, "-"],
        input="tritonclient[all]\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    version = re.search(r"^tritonclient==(\S+)$", done.stdout, re.MULTILINE)
    assert version is not None, done.stdout
    return f"tritonclient[all]=={version.group(1)}"


def venv(where: Path, extras: frozenset[str], resolution: str, extra: list[str], python: str = sys.executable) -> Path:
    """A new virtualenv with fnserve, ``extras`` (every direct requirement at ``resolution``) and ``extra``
    requirements; its bin directory."""
    target = where / "venv"
    subprocess.run([UV, "venv", "--quiet", "--python", python, str(target)], check=True, timeout=300)
    done = subprocess.run(
        [UV, "pip", "install", "--quiet", "--native-tls", "--python", str(target / "bin" / "python")]
        + ["--resolution", resolution, f"{REPO}[{','.join(sorted(extras))}]", *requirements(extras), *extra],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return target / "bin"


@dataclass(frozen=True)
class Env:
    """A fresh virtualenv's bin directory, the environment its programs run in, and where logs go."""

    bin: Path
    env: dict[str, str]
    logs: Path

    def python(self, code: str, extra_env: dict[str, str] | None = None) -> str:
        """What ``code`` prints, run by the virtualenv's Python from the repository (where functions/ is)."""
        done = subprocess.run(
            [str(self.bin / "python"), "-c", code],
            cwd=REPO,
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout


def environment(bin_dir: Path, logs: Path) -> Env:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FNSERVE_")) and k != "PYTHONPATH"}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FNSERVE_MANIFEST": str(DEMO_MANIFEST)}
    return Env(bin_dir, env, logs)


# -- the smokes: each starts what its extra is for, from the fresh virtualenv ---------------------------------

DIGITS = json.dumps(np.load(DEMO_HOLDOUT)["input"][:1].tolist())  # one digit of the demo's held-out set

TRITON_HTTP = f"""
import numpy as np, tritonclient.http as http
client = http.InferenceServerClient("127.0.0.1:{{port}}")
assert client.is_server_ready()
x = http.InferInput("input", [1, 64], "FP32")
x.set_data_from_numpy(np.array({DIGITS}, np.float32), binary_data=True)
result = client.infer("digits-fast", [x])
print(result.as_numpy("label").tolist())
"""

TRITON_GRPC = f"""
import numpy as np, tritonclient.grpc as grpc
client = grpc.InferenceServerClient("127.0.0.1:{{port}}")
assert client.is_server_ready()
x = grpc.InferInput("input", [1, 64], "FP32")
x.set_data_from_numpy(np.array({DIGITS}, np.float32))
result = client.infer("digits-fast", [x])
print(result.as_numpy("label").tolist())
"""


def expected_label(url: str) -> list[int]:
    """The server's own JSON answer for the digit, what each client must decode."""
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": json.loads(DIGITS)}]}
    answer = httpx.post(f"{url}/v2/models/digits-fast/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    label = next(o for o in answer.json()["outputs"] if o["name"] == "label")
    return list(label["data"])


def serve(env: Env, grpc: bool, http_client: bool = True) -> None:
    """``fnserve serve`` on the demo models, answered by tritonclient over HTTP (``http_client``: where
    tritonclient.http is installed) and gRPC beside it."""
    port = free_port()
    command = [str(env.bin / "fnserve"), "serve", "--port", str(port)]
    grpc_port = free_port()
    if grpc:
        command += ["--grpc-port", str(grpc_port)]
    process, url = start_http(command, port, env.logs / "serve.log", env=env.env)
    try:
        label = expected_label(url)
        if http_client:
            assert json.loads(env.python(TRITON_HTTP.format(port=port))) == label
        if grpc:
            assert json.loads(env.python(TRITON_GRPC.format(port=grpc_port))) == label
    finally:
        process.terminate()
        process.wait(30)


HANDLER = """
import json, sys
sys.path.insert(0, "functions/{function}")
import app
from fnserve.aws.events import LambdaContext
print("---" + json.dumps(app.handler(json.load(open("events/{event}")), LambdaContext())))
"""


def lambda_api(env: Env) -> None:
    """The API function's handler on an API Gateway event, as Lambda's runtime calls it."""
    printed = env.python(
        HANDLER.format(function="api", event="api-http-infer.json"), {"AWS_DEFAULT_REGION": "us-east-1"}
    )
    answer = json.loads(printed.rsplit("---", 1)[1])
    assert answer["statusCode"] == 200 and "outputs" in json.loads(answer["body"]), answer


def sqs_jobs(env: Env, moto_url: str) -> None:
    """The batch function's handler on a real-shaped SQS event, its results written to DynamoDB (moto)."""
    reset(moto_url)
    aws = aws_env(moto_url)
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_url, region_name="us-east-1", **_keys(aws))
    dynamodb.create_table(
        TableName="results",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    printed = env.python(
        HANDLER.format(function="batch", event="batch-jobs.json"), {**aws, "FNSERVE_RESULTS_TABLE": "results"}
    )
    answer = json.loads(printed.rsplit("---", 1)[1])
    records = json.loads((REPO / "events" / "batch-jobs.json").read_text())["Records"]
    assert answer == {"batchItemFailures": []}
    assert dynamodb.scan(TableName="results", Select="COUNT")["Count"] == len(records)


def _keys(aws: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": aws["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": aws["AWS_SECRET_ACCESS_KEY"],
        "aws_session_token": aws["AWS_SESSION_TOKEN"],
    }


def cloud_function(env: Env) -> None:
    """The HTTP Cloud Function on functions-framework (its ASGI mode), answering a V2 request."""
    port = free_port()
    command = [str(env.bin / "functions-framework"), "--target", "infer", "--source", "functions/gcp_api/main.py"]
    command += ["--asgi", "--host", "127.0.0.1", "--port", str(port)]
    process, url = start_http(command, port, env.logs / "gcp.log", env=env.env)
    try:
        assert expected_label(url)
    finally:
        process.terminate()
        process.wait(30)


REDIS_ROUND_TRIP = """
from fnserve.core.jobs.results import ResultRecord
from fnserve.stores.redis import RedisResultStore
store = RedisResultStore.from_url("{url}")
import time
record = ResultRecord.failed("k", "digits-fast", "stored", now=int(time.time()), ttl=60)
assert store.put([record]) == set()
print(store.get(["k"])["k"].error)
"""


def redis_results(env: Env, redis_url: str) -> None:
    """The Redis result store writing and reading a record on a real redis-server."""
    assert env.python(REDIS_ROUND_TRIP.format(url=redis_url)).strip() == "stored"


QUANTIZE = """
from pathlib import Path
from fnserve.quantize import quantize
quantize(Path("{source}"), Path("{target}"), mode="dynamic")
import onnxruntime
print(len(onnxruntime.InferenceSession("{target}").get_inputs()))
"""


def quantized(env: Env) -> None:
    """The quickstart's model quantized by the installed quantizer (onnx's tools), and the result loading."""
    target = env.logs / "int8.onnx"
    assert env.python(QUANTIZE.format(source=REPO / "examples" / "digits-mlp.onnx", target=target)).strip() == "1"


def emulated(env: Env) -> None:
    """``fnserve local`` on template.yaml, as make run starts it: the gateway answers the demo's request."""
    port = free_port()
    command = [str(env.bin / "fnserve"), "local", "--template", "template.yaml", "--port", str(port)]
    command += ["--manifest", str(DEMO_MANIFEST), "--parameter", "ApiAuth=NONE"]
    process, url = start_http(command, port, env.logs / "local.log", env=env.env, new_session=True, cwd=REPO)
    try:
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": json.loads(DIGITS)}]}
        answer = httpx.post(f"{url}/v2/models/digits-fast/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def smoke(extras: frozenset[str], env: Env, moto_url: str, redis_url: str) -> None:
    """Everything ``extras`` is for."""
    if "local" in extras:
        emulated(env)
    if extras & {"server", "grpc"}:
        serve(env, grpc="grpc" in extras)
    if "lambda" in extras:
        lambda_api(env)
    if "aws" in extras:
        sqs_jobs(env, moto_url)
    if "gcp" in extras:
        cloud_function(env)
    if "redis" in extras:
        redis_results(env, redis_url)
    if "quantize" in extras:
        quantized(env)
    if "cli" in extras or extras & {"server", "grpc"}:
        done = subprocess.run([str(env.bin / "fnserve"), "--help"], env=env.env, capture_output=True, text=True)
        assert done.returncode == 0 and "serve" in done.stdout, done.stderr[-3000:]


def test_the_images_and_the_readme_name_extra_sets() -> None:
    assert frozenset({"server", "grpc", "aws", "redis"}) in SETS  # the server image's
    assert frozenset({"lambda", "aws"}) in SETS  # the Lambda image's
    assert frozenset({"server"}) in SETS  # the README's 'fnserve[server,gpu]', on a CPU


def test_every_declared_requirement_has_a_floor() -> None:
    """A range without a lower bound cannot be tested at its lowest: every requirement users install says where it
    starts (the dev extra is the project's own tooling)."""
    extras = [lines for name, lines in PROJECT["optional-dependencies"].items() if name != "dev"]
    every = [Requirement(line) for line in PROJECT["dependencies"] + [line for lines in extras for line in lines]]
    floors = {">=", "==", "~="}
    unbounded = [str(r) for r in every if r.name != "fnserve" and not any(s.operator in floors for s in r.specifier)]
    assert not unbounded


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("resolution", ["lowest-direct", "highest"])
@pytest.mark.parametrize("extras", SETS, ids=lambda extras: ",".join(sorted(extras)))
def test_each_extra_set_runs_what_it_is_for(
    extras: frozenset[str], resolution: str, tritonclient: str, moto_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = environment(venv(tmp_path, extras, resolution, [tritonclient]), tmp_path)
    smoke(extras, env, moto_url, redis_url)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_pips_own_choice_for_the_server_beside_tritonclient_serves_grpc(tmp_path: Path) -> None:
    """The install our docs lead to, resolved by pip itself: tritonclient[grpc] holds protobuf below 7, so pip picks
    the lowest protobuf major fnserve allows, and the gRPC stubs must import under it."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=300)
    bin_dir = tmp_path / "venv" / "bin"
    done = subprocess.run(
        [str(bin_dir / "pip"), "install", "--quiet", f"{REPO}[server,grpc]", "tritonclient[grpc]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    env = environment(bin_dir, tmp_path)
    protobuf = env.python("import google.protobuf; print(google.protobuf.__version__)").strip()
    assert protobuf.split(".")[0] == "6", protobuf  # what the user got; 7 would test nothing here
    serve(env, grpc=True, http_client=False)


def pythons() -> Iterator[str]:
    """The supported Pythons other than the suite's."""
    yield from (v for v in PYTHONS if v != f"{sys.version_info.major}.{sys.version_info.minor}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("version", list(pythons()))
def test_each_supported_python_serves_and_runs_jobs(
    version: str, tritonclient: str, moto_url: str, redis_url: str, tmp_path: Path
) -> None:
    python = _interpreter(version)
    extras = frozenset({"server", "grpc", "aws", "redis"})  # the server image's set
    env = environment(venv(tmp_path, extras, "highest", [tritonclient], python=python), tmp_path)
    assert env.python("import sys; print('%d.%d' % sys.version_info[:2])").strip() == version
    smoke(extras, env, moto_url, redis_url)


def _interpreter(version: str) -> str:
    """An interpreter of ``version``, on PATH or under pyenv."""
    found = [
        shutil.which(f"python{version}"),
        *map(str, Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}")),
    ]
    for candidate in filter(None, found):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    pytest.skip(f"no Python {version} on this machine (pyenv install {version}): it is not tested here")


# -- the pages, from exactly the install the quickstart gives -------------------------------------------------------

README_OWN_MODEL = ".venv/bin/fnserve quantize my-model.onnx"
README_DEMO = "make serve"  # its comment names the command it stands for, which needs no `make setup`
# A sweep of minutes, cut to seconds: what the reader's run needs from the install (the plots, the report) is the same.
SHORT_BENCH = "--seconds 0.2 --confirm-seconds 0 --floor-seconds 0.05 --max-concurrency 4"


def readers_lines(block: str, reader: Path, env: dict[str, str], port: int) -> None:
    """A block a reader runs as it reads: a server line left running in the foreground (on ``port``), what comes
    before and after it each run to a zero exit, every JSON answer not an error."""
    block = block.replace("localhost:8080", f"127.0.0.1:{port}")
    block = re.sub(
        r"^(\.venv/bin/fnserve bench[^\n#]*)", rf"\1 {SHORT_BENCH} --out {reader / 'bench'} ", block, flags=re.M
    )
    parts = re.split(r"^(\.venv/bin/fnserve serve[^\n]*)\n", block, flags=re.MULTILINE)
    with servers_stopped() as started:
        for number, part in enumerate(parts):
            if part.startswith(".venv/bin/fnserve serve"):
                log = reader / f"server{number}.log"
                server_env = {**env, "FNSERVE_PORT": str(port)}
                proc, _ = start_http(
                    ["bash", "-c", f"exec {part}"], port, log, env=server_env, new_session=True, cwd=reader
                )
                started.append(proc)
            elif part.strip():
                output = run_block(part, reader, env, number, timeout=600)
                assert all("error" not in json.loads(line) for line in output.splitlines() if line.startswith("{"))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_quickstart_and_the_readme_run_from_exactly_the_quickstarts_install(tmp_path: Path) -> None:
    """A fresh virtualenv of the extras the quickstart's install block names, and nothing else; from it, every block
    of the quickstart that needs no AWS account, then the README's demo request and its own-model commands,
    ``fnserve bench`` included (its sweep cut short), each to a zero exit. ``make run`` and ``make test`` make
    their own virtualenv (tests/e2e and CI run them)."""
    bin_dir = venv(tmp_path / "install", install_extras(), "highest", [])
    env = {k: v for k, v in environment(bin_dir, tmp_path).env.items() if k != "FNSERVE_MANIFEST"}
    (tmp_path / "quickstart").mkdir()
    reader = reader_dir(tmp_path / "quickstart", bin_dir.parent, REPO)
    skipped = run_quickstart(reader, env, lambda block: ".venv/bin/fnserve models push" in block)
    assert len(skipped) == 1, "only the deploy needs an account"
    assert (reader / "my-models" / "my-model" / "1" / "model.onnx").is_file()

    readme = [block for block in sh_blocks(REPO / "README.md")]
    (tmp_path / "readme").mkdir()
    reader = reader_dir(tmp_path / "readme", bin_dir.parent, REPO)
    shutil.copy(REPO / "examples" / "digits-mlp.onnx", reader / "my-model.onnx")  # a float model of the reader's
    demo = next(block for block in readme if starts(block, README_DEMO))
    served = re.match(r"make serve\s+# or: (.+)", demo)
    assert served is not None, demo.splitlines()[0]
    readers_lines(demo.replace(demo.splitlines()[0], served.group(1), 1), reader, env, free_port())
    readers_lines(next(block for block in readme if starts(block, README_OWN_MODEL)), reader, env, free_port())
    assert (reader / "bench" / "recommended.txt").is_file()
