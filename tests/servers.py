"""Starting HTTP servers in tests and waiting on conditions: stdlib and httpx only (the GPU machine has no more)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.moto import free_port


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def start_server(
    options: list[str], log: Path, env: dict[str, str] | None = None, new_session: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """A ``fnserve serve`` process on a free port, once it answers ready; output goes to ``log``."""
    port = free_port()
    cmd = [sys.executable, "-m", "fnserve", "serve", "--port", str(port), *options]
    return start_http(cmd, port, log, env=env, new_session=new_session)


def start_http(
    cmd: list[str],
    port: int,
    log: Path,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    ready_path: str = "/v2/health/ready",
    ready_status: int = 200,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Any HTTP server process (``cmd``, listening on ``port``), once GET ``ready_path`` answers
    ``ready_status`` (a V2 server's readiness by default); output goes to ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=new_session, cwd=cwd
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(f"{url}{ready_path}", timeout=1).status_code == ready_status
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 60, "the server to become ready")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, url
