"""A real `fnserve local` process on the repository's template, for the end-to-end tests and benchmarks."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import REPO
from tests.moto import free_port
from tests.servers import wait_for


@contextmanager
def running_local(options: list[str], log: Path, env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """`fnserve local` with ``options``, output to ``log``, once it answers; yields what GET /_fnserve/local
    says, with its ``url`` and ``log``; stops it as Ctrl-C does after."""
    port = free_port()
    cmd = [sys.executable, "-m", "fnserve", "local", "--template", str(REPO / "template.yaml"), "--port", str(port)]
    if not any(option.startswith("ApiAuth=") for option in options):  # the tests of other things call unsigned
        cmd += ["-p", "ApiAuth=NONE"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, *options], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    info: dict[str, Any] = {}

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"fnserve local exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            info.update(httpx.get(f"{url}/_fnserve/local", timeout=1).json())
            return True
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, 120, "fnserve local to start")
        yield {"url": url, "log": log, **info}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
