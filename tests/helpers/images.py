"""The server image (infra/container/Dockerfile and its CUDA variant) started as a container runtime starts it, on
free ports, and asked whether it answers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.image.buildah import Built, Running, started
from tests.moto import free_port


@contextmanager
def serving(
    image: Built, log: Path, env: dict[str, str] | None = None, volumes: dict[Path, str] | None = None
) -> Iterator[tuple[Running, str, str]]:
    """The image's own command running; yields it with its HTTP base URL and gRPC address."""
    http, grpc = free_port(), free_port()
    command = image.config["Entrypoint"] + image.config["Cmd"]
    ports = {"FNSERVE_PORT": str(http), "FNSERVE_GRPC_PORT": str(grpc)}
    with started(image.name, command, log, {**ports, **(env or {})}, volumes) as running:
        yield running, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}"


def ping(running: Running, url: str) -> int | None:
    assert running.process.poll() is None, running.output()
    try:
        return httpx.get(f"{url}/ping", timeout=2).status_code
    except httpx.TransportError:
        return None
