"""LocalStack for the end-to-end tests, without Docker: SQS, S3 and Secrets Manager from localstack-core.

It runs from .venv-localstack (Python 3.13, tests/e2e/localstack.txt), which `make test` builds. DynamoDB is not
LocalStack's here: LocalStack's DynamoDB is DynamoDB Local, a Java jar under AWS's own terms (not an open-source
licence) that it downloads at the first call, and this project does not download it; a moto server stands in.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers import REPO
from tests.moto import free_port
from tests.servers import wait_for

VENV = REPO / ".venv-localstack"
SERVICES = ("sqs", "s3", "secretsmanager")


@contextmanager
def localstack(state: Path) -> Iterator[str]:
    """LocalStack on a free 127.0.0.1 port, its state and log (``localstack.log``) in ``state``; yields its URL
    once its health endpoint reports every service ready; stops it after."""
    python = VENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(
            f"no LocalStack: {VENV.relative_to(REPO)} is missing; `make .venv-localstack/.installed` builds it "
            "(Python 3.13 and tests/e2e/localstack.txt; make test does)"
        )
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(state),  # nothing of LocalStack's lands in the user's home
        "SERVICES": ",".join(SERVICES),
        "GATEWAY_LISTEN": f"127.0.0.1:{port}",
        "LOCALSTACK_HOST": f"127.0.0.1:{port}",
        "SQS_ENDPOINT_STRATEGY": "path",  # queue URLs on 127.0.0.1 (the default names hosts that need public DNS)
        "OVERRIDE_IN_DOCKER": "0",
        "FILESYSTEM_ROOT": str(state / "root"),  # else /var/lib/localstack
        "SKIP_SSL_CERT_DOWNLOAD": "1",
        "DNS_ADDRESS": "0",  # no DNS server of its own
        "DISABLE_EVENTS": "1",  # no analytics
    }
    log = state / "localstack.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(python), "-m", "localstack.runtime.main"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=state,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"LocalStack exited with {proc.returncode}; its log ({log}):\n{log.read_text()[-5000:]}")
        try:
            services = httpx.get(f"{url}/_localstack/health", timeout=1).json()["services"]
        except (httpx.TransportError, ValueError, KeyError):
            return False
        return all(services.get(name) in ("available", "running") for name in SERVICES)

    try:
        try:
            wait_for(ready, 60, "LocalStack's health endpoint")
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}; LocalStack's log ({log}):\n{log.read_text()[-5000:]}") from None
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
