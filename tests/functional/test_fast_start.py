"""A fast start as the one-port platforms run it (``FNSERVE_FAST_START``): the port closed until the server can answer
when told so (Cloud Run's TCP startup probe then sends the first request at once), and the other front processes
started only once the first has answered, so that nothing else takes a CPU from that answer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.helpers import DEMO_MANIFEST, digits_body
from tests.moto import free_port
from tests.servers import wait_for

BODY = digits_body("FP32", str([0.0] * 64))


def fast_start(port: int, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``fnserve serve`` on the demo's models as the deploy files run it: fast start, no gRPC, two front processes."""
    variables = {key: value for key, value in os.environ.items() if not key.startswith("FNSERVE_")}
    variables |= {"FNSERVE_FAST_START": "true", "FNSERVE_GRPC_PORT": "off", "FNSERVE_MANIFEST": str(DEMO_MANIFEST)}
    command = [sys.executable, "-m", "fnserve", "serve", "--port", str(port), "--processes", "2", "--workers", "0"]
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=variables | env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def children(pid: int) -> list[str]:
    """The command lines of ``pid``'s child processes (a front process, multiprocessing's resource tracker)."""
    lines = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                lines.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except FileNotFoundError:  # exited since
                continue
    return lines


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def test_a_port_closed_while_the_models_load_first_answers_ready(tmp_path: Path) -> None:
    port = free_port()
    proc = fast_start(port, tmp_path / "serve.log", FNSERVE_ANSWER_WHILE_LOADING="false")
    seen: list[int | str] = []
    try:
        while 200 not in seen:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                seen.append(httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code)
            except httpx.ConnectError:
                if not seen or seen[-1] != "refused":
                    seen.append("refused")
            assert len(seen) < 10_000, seen[-20:]
    finally:
        stop(proc)
    # Refused while the demo's models load (a second or more), then ready at its first answer: never a 503.
    assert seen == ["refused", 200], seen


def test_a_fast_starts_other_front_processes_start_once_it_has_answered(tmp_path: Path) -> None:
    port = free_port()
    proc = fast_start(port, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 60, "the first front process")
        # Ready, and alone: no front process spawned yet, nor the resource tracker a shared counter would start.
        assert children(proc.pid) == []
        answer = httpx.post(f"{url}/v2/models/digits-accurate/infer", content=BODY, timeout=30)
        assert answer.status_code == 200, answer.text

        def spawned() -> bool:
            return any("spawn_main" in line for line in children(proc.pid))

        wait_for(spawned, 30, "the second front process")
    finally:
        stop(proc)
