"""docs/quickstart.md runs as written, block after block, in a fresh directory: its servers started as a reader
starts them, its curls answering what the page shows, its own model quantized, added and served. The blocks that
need an AWS account do not run here, nor the install: tests/install installs the page's extras fresh, at their
floors and latest, and runs what each is for; here the project's virtualenv stands in for it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, documented
from tests.helpers.docs import starts
from tests.moto import free_port
from tests.servers import start_http

PAGE = REPO / "docs" / "quickstart.md"
BLOCKS = re.findall(r"```sh\n(.*?)```", PAGE.read_text(), re.DOTALL)
SERVERS = (".venv/bin/fnserve serve",)  # a block that starts one stays in the foreground
# Pushing to a bucket and deploying need an account: tests/functional/test_publish.py pushes to moto, and make test's
# sam-check builds what make deploy deploys.
NEEDS_AN_ACCOUNT = ".venv/bin/fnserve models push"
INSTALL = "python3 -m venv .venv"
DEMO_PORT, OWN_PORT = 8080, 8090  # the ports the page uses: the demo's default, and the one it gives its own model


def shown_answers(block: str) -> list[list[str]]:
    """What the block's comments show of each answer, as the pieces around its ``...``."""
    answers: list[str] = []
    for line in block.splitlines():
        text = line.strip()
        if text.startswith("# {"):
            answers.append(text[2:])
        elif text.startswith("#") and answers:  # an answer's next line
            answers[-1] += text[1:].strip()
    return [[piece for piece in shown.split("...") if piece] for shown in answers]


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Path]:
    """A directory a reader's checkout would be: the Makefile, the project, its virtualenv and the demo models.
    Whatever the page writes lands here."""
    for name in ("Makefile", "pyproject.toml", "layers", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    yield tmp_path


def test_the_quickstart_has_its_steps() -> None:
    steps = [INSTALL, ".venv/bin/fnserve serve", "curl", ".venv/bin/fnserve quantize"]
    assert [starts(block, command) for block, command in zip(BLOCKS, steps, strict=False)] == [True] * len(steps)
    assert frozenset({"server", "quantize"}) in documented(), "tests/install must install the page's extras"


def test_the_quickstart_runs_as_written(reader: Path) -> None:
    ports = {DEMO_PORT: free_port(), OWN_PORT: free_port()}
    env = {**os.environ, "FNSERVE_PORT": str(ports[DEMO_PORT])}  # `make serve`'s port, which the page leaves default
    servers: list[subprocess.Popen[bytes]] = []
    skipped: list[int] = []
    try:
        for number, written in enumerate(BLOCKS, 1):
            block = written
            for port, free in ports.items():
                block = block.replace(f"localhost:{port}", f"127.0.0.1:{free}").replace(
                    f"--port {port}", f"--port {free}"
                )
            if starts(block, INSTALL):
                continue
            if NEEDS_AN_ACCOUNT in block:
                skipped.append(number)
                continue
            if any(starts(block, server) for server in SERVERS):
                port = next((free for free in ports.values() if f"--port {free}" in block), ports[DEMO_PORT])
                cmd = ["bash", "-c", f"exec {block.strip()}"]
                log = reader / f"block{number}.log"
                proc, _ = start_http(cmd, port, log, env=env, new_session=True, cwd=reader)
                servers.append(proc)
                continue
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.replace("curl -s", "curl -s -w '\\n'")],
                cwd=reader,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"block {number} failed:\n{written}\n{done.stdout}{done.stderr}"
            answers = [line for line in done.stdout.splitlines() if line.startswith("{")]
            shown = shown_answers(written)
            assert len(answers) == len(shown), f"block {number} shows {len(shown)} answers; got {done.stdout}"
            for pieces, answer in zip(shown, answers, strict=True):
                assert "error" not in json.loads(answer), answer
                for piece in pieces:
                    assert piece in answer, f"block {number} shows {piece}; the server answered {answer[:300]}"
        assert (reader / "my-models" / "my-model" / "1" / "model.onnx").is_file()
        assert skipped == [len(BLOCKS)], f"only the last block, the deploy, may need an account: {skipped}"
    finally:
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
