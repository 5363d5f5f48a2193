"""Reading the shell blocks of the README and the docs pages, and running a page's blocks as a reader runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.moto import free_port
from tests.servers import start_http

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
SERVERS = (".venv/bin/fnserve serve",)  # a block that starts one stays in the foreground
INSTALL = "python3 -m venv .venv"
DEMO_PORT, OWN_PORT = 8080, 8090  # the ports the quickstart uses: the demo's default, and its own model's


def starts(block: str, command: str) -> bool:
    return re.match(re.escape(command) + r"(\s|$)", block.lstrip()) is not None


def sh_blocks(page: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", page.read_text(), re.DOTALL)


def install_extras(page: Path = QUICKSTART) -> frozenset[str]:
    """The extras the page's install block installs: ``.[server,quantize,bench]`` -> {server, quantize, bench}."""
    found = re.search(r'pip install "\.\[([a-z0-9_,-]+)\]"', next(b for b in sh_blocks(page) if starts(b, INSTALL)))
    assert found is not None, f"{page}: no install of the checkout's extras"
    return frozenset(found.group(1).split(","))


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


def reader_dir(where: Path, venv: Path, repo: Path) -> Path:
    """A directory a reader's checkout would be: the Makefile, the project, the demo models and ``venv`` as its
    ``.venv``. Whatever the page writes lands here."""
    for name in ("Makefile", "pyproject.toml", "layers", "examples"):
        (where / name).symlink_to(repo / name)
    (where / ".venv").symlink_to(venv)
    return where


def run_block(block: str, reader: Path, env: dict[str, str], number: int, timeout: float = 120) -> str:
    """One block that ends, run by bash with -euo pipefail; its output, each curl's answer on a line of its own."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.replace("curl -s", "curl -s -w '\\n'")],
        cwd=reader,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"block {number} failed:\n{block}\n{done.stdout}{done.stderr}"
    return done.stdout


def check_answers(written: str, output: str, number: int) -> None:
    """Each JSON answer the block printed holds what its comments show, and none is an error."""
    answers = [line for line in output.splitlines() if line.startswith("{")]
    shown = shown_answers(written)
    assert len(answers) == len(shown), f"block {number} shows {len(shown)} answers; got {output}"
    for pieces, answer in zip(shown, answers, strict=True):
        assert "error" not in json.loads(answer), answer
        for piece in pieces:
            assert piece in answer, f"block {number} shows {piece}; the server answered {answer[:300]}"


@contextmanager
def servers_stopped() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The servers a page starts, each stopped (its whole process group) at the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def run_quickstart(
    reader: Path, env: dict[str, str], skip: Callable[[str], bool], blocks: Sequence[str] | None = None
) -> list[int]:
    """docs/quickstart.md's blocks in order, in ``reader``: its servers started as a reader starts them (on free
    ports), each other block run to a zero exit and its answers checked; the install and the blocks ``skip`` names
    are not run. The numbers of the blocks skipped."""
    ports = {DEMO_PORT: free_port(), OWN_PORT: free_port()}
    env = {**env, "FNSERVE_PORT": str(ports[DEMO_PORT])}  # the demo's port, which the page leaves at its default
    skipped: list[int] = []
    with servers_stopped() as started:
        for number, written in enumerate(blocks if blocks is not None else sh_blocks(QUICKSTART), 1):
            block = written
            for port, free in ports.items():
                block = block.replace(f"localhost:{port}", f"127.0.0.1:{free}").replace(
                    f"--port {port}", f"--port {free}"
                )
            if starts(block, INSTALL):
                continue
            if skip(block):
                skipped.append(number)
                continue
            if any(starts(block, server) for server in SERVERS):
                port = next((free for free in ports.values() if f"--port {free}" in block), ports[DEMO_PORT])
                log = reader / f"block{number}.log"
                proc, _ = start_http(
                    ["bash", "-c", f"exec {block.strip()}"], port, log, env=env, new_session=True, cwd=reader
                )
                started.append(proc)
                continue
            check_answers(written, run_block(block, reader, env, number), number)
    return skipped
