"""`fnserve local` through an AWS outage: its pollers back off, say so once, and process every later job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fnserve.aws import clients
from fnserve.core.jobs.messages import job_message
from fnserve.stores import job_client
from tests.e2e.emulator import running_local
from tests.faults import FaultyProxy, faulty_proxy
from tests.helpers import DEMO_HOLDOUT
from tests.moto import aws_env, moto_server
from tests.servers import wait_for

DIGITS = np.load(DEMO_HOLDOUT)["input"]


@pytest.fixture
def emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, Any], FaultyProxy, Path]]:
    """`fnserve local` whose AWS endpoint is a moto server behind a proxy the test can cut."""
    with moto_server(tmp_path / "moto.log") as moto_url, faulty_proxy(moto_url) as proxy:
        for key, value in aws_env(proxy.url).items():
            monkeypatch.setenv(key, value)
        clients.reset()
        options = ["--workers", "1", "--visibility-timeout", "3"]
        options += [
            "--parameter",
            "MaximumBatchingWindowInSeconds=0",
            "--parameter",
            "FollowupBatchingWindowInSeconds=0",
        ]
        with running_local(options, tmp_path / "local.log", dict(os.environ)) as info:
            yield info, proxy, info["log"]
        clients.reset()


def test_pollers_outlive_an_aws_outage_and_process_every_later_job(
    emulator: tuple[dict[str, Any], FaultyProxy, Path],
) -> None:
    local, proxy, log = emulator
    pollers = ("BatchFunction's queue", "FollowupFunction's queue")
    proxy.set("down")
    wait_for(lambda: all(f"{p}" in _outages(log) for p in pollers), 60, "every poller to notice the outage")
    health = httpx.get(f"{local['url']}/v2/health/live", timeout=10)
    assert health.status_code == 200  # HTTP answers throughout
    proxy.set("forward")
    wait_for(lambda: all(f"{p}" in _recoveries(log) for p in pollers), 60, "every poller to recover")

    queue, table = local["queues"]["JobsQueue"], local["tables"]["ResultsTable"]
    ids = [f"after-{i}" for i in range(20)]
    jobs = (job_message(job_id, "digits-accurate", {"input": DIGITS[i : i + 1]}) for i, job_id in enumerate(ids))
    assert job_client.submit(queue, jobs).ids == ids
    wait_for(lambda: not job_client.fetch_results(table, ids).pending, 60, "every job after the outage")
    assert sorted(job_client.fetch_results(table, ids).done) == sorted(ids)

    text = log.read_text()
    assert "Exception in thread" not in text and "Traceback" not in text
    for poller in pollers:  # once when the outage starts, once when it ends: not a line per retry
        assert _outages(log).count(poller) == _recoveries(log).count(poller) == 1


def _outages(log: Path) -> str:
    return "\n".join(line for line in log.read_text().splitlines() if "cannot be polled" in line)


def _recoveries(log: Path) -> str:
    return "\n".join(line for line in log.read_text().splitlines() if "is polled again" in line)
