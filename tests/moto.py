"""A real moto server on loopback for the functional tests (SQS, DynamoDB, S3 over HTTP)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """Start ``moto_server`` on a free 127.0.0.1 port; yields its URL; stops it after."""
    port = free_port()
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}: {log.read_text()}")
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def reset(url: str) -> None:
    """Drop every queue, table and bucket."""
    httpx.post(f"{url}/moto-api/reset", timeout=10).raise_for_status()


AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def aws_env(url: str) -> dict[str, str]:
    return {**AWS_ENV, "AWS_ENDPOINT_URL": url}


def apply_env(env: dict[str, str]) -> None:
    os.environ.update(env)
