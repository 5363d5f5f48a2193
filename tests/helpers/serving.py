"""``fnserve serve`` processes as the functional tests run them: the request limit they set, and a server with
HTTP and gRPC in its own session, stopped with its whole process group."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import slow_model, write_test_manifest
from tests.moto import free_port
from tests.servers import start_server

MAX_REQUEST_BYTES = 1 << 20


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    address: str  # gRPC host:port
    log: Path
    url: str  # HTTP


def serve_with_grpc(directory: Path, options: tuple[str, ...] = ("--workers", "1", "--processes", "1")) -> Served:
    """``fnserve serve --grpc-port`` on the test models, the demo cascade and a slow model."""
    manifest = write_test_manifest(directory, cascade=True)
    data = slow_model().SerializeToString()
    (directory / "slow.onnx").write_bytes(data)
    # One runtime call (one job in the worker) however many rows: no chunks of max_batch_size.
    slow = '[[models]]\nname = "slow"\npath = "slow.onnx"\nmax_batch_size = 100000\n'
    slow += f'sha256 = "{hashlib.sha256(data).hexdigest()}"\n'
    manifest.write_text(slow + manifest.read_text())
    port = free_port()
    log = directory / "serve.log"
    env = {**os.environ, "FNSERVE_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)}
    proc, url = start_server(["-m", str(manifest), "--grpc-port", str(port), *options], log, env=env, new_session=True)
    return Served(proc, f"127.0.0.1:{port}", log, url)


def stop(served: Served) -> None:
    if served.proc.poll() is None:
        os.killpg(served.proc.pid, signal.SIGTERM)
        served.proc.wait(timeout=60)
