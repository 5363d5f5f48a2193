"""How long ``make run`` takes to drain a load of batch jobs, end to end.

    make bench        (or: python -m tests.bench.bench_drain)

``fnserve local`` on the repository's template with its defaults (the embedded moto server,
one worker per function, BatchSize 1000, a 5 s batching window), as ``make run`` starts it.
DRAIN_JOBS jobs of one digits row each are sent as ``fnserve submit`` sends them (10 per
SendMessageBatch); the clock runs from the first send until every result is stored, read
back with ``fnserve results``'s reads. Reported: send time, drain time and jobs per second.
(Before moto's SQS speed-ups, ``fnserve.adapters.local.moto_sqs``, 2,000 jobs took 99 s here.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from fnserve import jobsclient
from fnserve.aws import clients
from fnserve.core.jobs import job_message
from tests.helpers import DEMO_HOLDOUT, REPO
from tests.moto import free_port

JOBS = int(os.environ.get("DRAIN_JOBS", "10000"))
DIGITS = np.load(DEMO_HOLDOUT)["input"]


def main() -> None:
    log = Path(tempfile.mkdtemp(prefix="fnserve-bench-")) / "local.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "LOCALSTACK_HOST"}
    cmd = [sys.executable, "-m", "fnserve", "local", "--template", str(REPO / "template.yaml"), "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        info = _wait_ready(proc, port, log)
        os.environ.update({"AWS_ENDPOINT_URL": info["endpoint"], "AWS_DEFAULT_REGION": "us-east-1"})
        os.environ.update({"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"})
        clients.reset()
        queue, table = info["queues"]["JobsQueue"], info["tables"]["ResultsTable"]
        ids = [f"drain-{i:06d}" for i in range(JOBS)]
        jobs = (
            job_message(job_id, "digits-accurate", {"input": DIGITS[i % len(DIGITS)][None]})
            for i, job_id in enumerate(ids)
        )
        start = time.perf_counter()
        report = jobsclient.submit(queue, jobs)
        sent = time.perf_counter() - start
        assert len(report.ids) == JOBS and not report.failed
        pending = ids
        while pending:
            time.sleep(1)
            found = jobsclient.fetch_results(table, pending)
            assert not found.failed, list(found.failed.items())[:3]
            pending = found.pending
        drained = time.perf_counter() - start
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    print(f"make run's emulator (embedded moto, template defaults): {JOBS} digits jobs")
    print(f"  sent in {sent:.1f} s; every result stored {drained:.1f} s after the first send")
    print(f"  {JOBS / drained:.0f} jobs/s end to end (target: 10,000 in <= 120 s)")


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fnserve local exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/_fnserve/local", timeout=1).json()  # type: ignore[no-any-return]
        except httpx.TransportError:
            time.sleep(0.1)
    raise TimeoutError("fnserve local did not start")


if __name__ == "__main__":
    main()
