"""Functional fixtures: a real ``fnserve serve`` process on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import write_test_manifest

MAX_REQUEST_BYTES = 1 << 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def test_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_manifest(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def server(test_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running server with the demo models and the all-datatypes identity model."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "FNSERVE_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)}
    cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(test_manifest), "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 60, "the server to become ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=10) as c:
        yield c
