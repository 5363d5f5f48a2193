"""The server image's start budget: from the container's process starting to its first answer (a 200 to an
inference request), for a platform that scales to zero (Cloud Run, Knative, SageMaker Serverless), on digits and
on MiniLM. fnserve is started as such a platform's deploy file starts it (gRPC off: it routes one port), by
default and with ``FNSERVE_FAST_START``, then fast with the image's gRPC server on too, for what that adds; beside
the floor, a bare process in the same image that loads the same model and answers the same request
(``floor_server.py``).

Every start is a new process (``buildah run``) in one container of the image, made before the clock starts:
making a container copies the image's files, which a platform does once per host, not per start. The first start
of each kind is not timed (the files then come from the disk, later from its cache). The figures are printed;
the test asserts only that every start answers, and answers as the floor does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fnserve.emulator.images import Container
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.image.buildah import Built
from tests.moto import free_port

ROUNDS = 3
MODELS = "/opt/ml/model"  # where the image has the demo models
MOUNT = "/start-budget"  # this test's manifests and floor server, mounted into the container
PYTHON = "/opt/fnserve/bin/python"
ROW = np.load(DEMO_HOLDOUT)["input"][:1]
TEXT = "A cold instance pays its whole start before its first answer."
START_WITHIN_S = 120.0
POLL_SECONDS = 0.01  # between requests while the server starts: the figures' resolution


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # the manifest's model (and pipeline) the case serves
    served: str  # what the request names
    request: dict[str, Any]


CASES = (
    Case(
        "digits",
        "digits-accurate",
        "digits-accurate",
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW.ravel().tolist()}]},
    ),
    Case(
        "MiniLM",
        "minilm-l6",
        "minilm-embed",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [TEXT]}]},
    ),
)
# fnserve as the deploy files of platforms that route one port run it (gRPC off), by default and with the fast
# start; then the fast start with the image's gRPC server on too, for what it adds.
WAYS = ("floor", "fnserve serve", "fnserve serve, fast start", "fast start, and gRPC")


def _manifest(case: Case) -> str:
    """The demo manifest's entry of the case's model (and its pipeline), at the image's paths."""
    demo = tomllib.loads(DEMO_MANIFEST.read_text())
    entry = next(m for m in demo["models"] if m["name"] == case.model)
    lines = ["[[models]]"] + [f"{key} = {json.dumps(value)}" for key, value in entry.items()]
    lines[lines.index(f"path = {json.dumps(entry['path'])}")] = f'path = "{MODELS}/{entry["path"]}"'
    if case.served != case.model:
        pipeline = next(p for p in demo["pipelines"] if p["name"] == case.served)
        lines += ["[[pipelines]]", f'name = "{pipeline["name"]}"', f'model = "{case.model}"']
        for kind in ("pre", "post"):
            for step in pipeline.get(kind, []):
                lines.append(f"[[pipelines.{kind}]]")
                for key, value in step.items():
                    value = f"{MODELS}/{value}" if key == "tokenizer" else value
                    lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def container(server_image: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Container, Path]]:
    """One container of the server image, this test's files mounted; each start runs a new process in it."""
    files = tmp_path_factory.mktemp("start-budget")
    os.chmod(files, 0o755)  # the image's user reads it
    (files / "floor_server.py").write_text((Path(__file__).parent / "floor_server.py").read_text())
    for case in CASES:
        (files / f"{case.name}.toml").write_text(_manifest(case))
    box = Container(server_image.name, [], volumes={str(files): MOUNT}).create()
    try:
        yield box, files
    finally:
        box.stop()


def _command(case: Case, way: str, port: int) -> tuple[list[str], dict[str, str]]:
    if way == "floor":
        demo = {m["name"]: m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"]}
        command = [PYTHON, f"{MOUNT}/floor_server.py", str(port), f"{MODELS}/{demo[case.model]['path']}"]
        if case.served != case.model:
            command.append(f"{MODELS}/minilm-l6/tokenizer.json")
        return command, {}
    env = {"FNSERVE_PORT": str(port), "FNSERVE_GRPC_PORT": str(free_port()) if "gRPC" in way else "off"}
    env["FNSERVE_MANIFEST"] = f"{MOUNT}/{case.name}.toml"
    if "fast start" in way:  # as Cloud Run's service.yaml: the port closed until the server answers
        env["FNSERVE_FAST_START"] = "true"
        env["FNSERVE_ANSWER_WHILE_LOADING"] = "false"
    return ["fnserve", "serve"], env  # as a deploy file's args: [serve], every option in the environment


@dataclass
class Start:
    seconds: float
    answer: dict[str, Any]
    log: str


def _start(box: Container, log: Path, case: Case, way: str) -> Start:
    """One start: the process started, a request sent every ``POLL_SECONDS`` until one is answered 200; then
    stopped."""
    port = free_port()
    command, env = _command(case, way, port)
    url = f"http://127.0.0.1:{port}/v2/models/{case.served}/infer"
    with log.open("wb") as out:
        run = Container(box.image, command, env, volumes=box.volumes, output=out, name=box.name)
        began = time.monotonic()
        process = run.start().process
    assert process is not None
    try:
        with httpx.Client(timeout=30) as client:
            while True:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() - began < START_WITHIN_S, log.read_text()
                with contextlib.suppress(httpx.TransportError):
                    answer = client.post(url, json=case.request)
                    if answer.status_code == 200:
                        return Start(time.monotonic() - began, answer.json(), log.read_text())
                    assert answer.status_code == 503, answer.text  # starting: its models are loading
                time.sleep(POLL_SECONDS)
    finally:
        process.terminate()  # buildah passes SIGTERM on
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _output(answer: dict[str, Any]) -> np.ndarray[Any, Any]:
    tensor = next(o for o in answer["outputs"] if o["name"] in ("label", "embedding"))
    return np.asarray(tensor["data"])


def test_fresh_starts_to_the_first_answer_beside_the_floor(
    container: tuple[Container, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    box, _ = container
    for case in CASES:  # not timed: the files read from the disk once
        for way in ("floor", "fnserve serve, fast start"):
            _start(box, tmp_path / "warm.log", case, way)
    seconds: dict[tuple[str, str], list[float]] = {}
    for n in range(ROUNDS):
        for case in CASES:
            floor: np.ndarray[Any, Any] | None = None
            for way in WAYS:
                start = _start(box, tmp_path / f"{case.name}-{way}-{n}.log", case, way)
                seconds.setdefault((case.name, way), []).append(start.seconds)
                got = _output(start.answer)
                if floor is None:
                    floor = got
                else:  # answers as the floor does: the same label, the same embedding
                    np.testing.assert_allclose(got, floor, atol=1e-4, err_msg=f"{case.name}, {way}")
                if "fast start" in way:
                    assert "fast start" in start.log, start.log
    lines = [
        f"\nserver image start, process start (buildah run) to the first 200 on an inference, median of {ROUNDS} "
        f"(range), {os.cpu_count()} CPUs:"
    ]
    for case in CASES:
        lines.append(f"  {case.name} ({case.served}):")
        base = statistics.median(seconds[(case.name, "floor")])
        for way in WAYS:
            times = seconds[(case.name, way)]
            median = statistics.median(times)
            ratio = "the floor: bare onnxruntime + http.server" if way == "floor" else f"{median / base:.2f}x floor"
            lines.append(f"    {way:<26} {median:5.2f} s ({min(times):.2f}-{max(times):.2f})  {ratio}")
    with capsys.disabled():
        print("\n".join(lines))
