"""The real servers the tests share, as session fixtures: a moto server and a redis-server (Debian's package), each
on a free loopback port. A tier's conftest.py imports the ones it uses."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
import redis

from tests.moto import free_port, moto_server
from tests.servers import wait_for


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed: `make test` installs it (apt-get install redis-server)")
    port = free_port()
    directory = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(up, 10, "redis-server to answer")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
