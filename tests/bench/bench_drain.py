"""How long ``make run`` takes to drain a load of batch jobs, end to end.

    make bench        (or: python -m tests.bench.bench_drain)

``fnserve local`` on the repository's template with its defaults (the embedded moto server,
one worker per function, BatchSize 1000, a 5 s batching window), as ``make run`` starts it.
DRAIN_JOBS jobs of one digits row each are sent as ``fnserve submit`` sends them (10 per
SendMessageBatch), with DRAIN_POISON poison jobs of every kind the batch tests know spread
through them (no id, not JSON, unknown model, wrong shapes and datatypes, missing or invalid
S3 payloads, numbers no tensor holds); the clock runs from the first send until every good
result is stored, read back with ``fnserve results``'s reads. Then: the good jobs not done
(must be 0), the poison stored as failed, and what is left in the queue (only the poison
without an id, in flight until it reaches the DLQ after maxReceiveCount deliveries), beside
the send time, the drain time and the jobs per second. (Before moto's SQS speed-ups in
``fnserve.emulator.moto_sqs``, 2,000 jobs took 99 s here.)
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from fnserve.aws import clients
from fnserve.core.jobs.messages import job_identity, job_message
from fnserve.stores import job_client
from tests.e2e.emulator import running_local
from tests.helpers import DEMO_HOLDOUT

JOBS = int(os.environ.get("DRAIN_JOBS", "10000"))
POISON = int(os.environ.get("DRAIN_POISON", "500"))
DIGITS = np.load(DEMO_HOLDOUT)["input"]


def main() -> None:
    log = Path(tempfile.mkdtemp(prefix="fnserve-bench-")) / "local.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "LOCALSTACK_HOST"}
    with running_local([], log, env) as info:
        os.environ.update({"AWS_ENDPOINT_URL": info["endpoint"], "AWS_DEFAULT_REGION": "us-east-1"})
        os.environ.update({"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"})
        clients.reset()
        queue, table = info["queues"]["JobsQueue"], info["tables"]["ResultsTable"]
        ids = [f"drain-{i:06d}" for i in range(JOBS)]
        bodies = [
            json.dumps(job_message(job_id, "digits-accurate", {"input": DIGITS[i % len(DIGITS)][None]}))
            for i, job_id in enumerate(ids)
        ]
        poison = _poison(POISON)
        step = JOBS // max(1, len(poison)) + 1
        for n, body in enumerate(poison):  # spread through the load: most batches meet some
            bodies.insert(n * step, body)
        start = time.perf_counter()
        _send(queue, bodies)
        sent = time.perf_counter() - start
        pending = ids
        while pending:
            time.sleep(1)
            found = job_client.fetch_results(table, pending)
            assert not found.failed, list(found.failed.items())[:3]
            pending = found.pending
        drained = time.perf_counter() - start
        named = [str(json.loads(body)["id"]) for body in poison if job_identity(body) is not None]
        refused = job_client.fetch_results(table, named)
        left = _in_queue(queue, len(poison) - len(named))
    print(f"make run's emulator (embedded moto, template defaults): {JOBS} digits jobs, {len(poison)} poison jobs")
    print(f"  sent in {sent:.1f} s; every good result stored {drained:.1f} s after the first send")
    print(f"  {JOBS / drained:.0f} good jobs/s end to end (target: 10,000 in <= 120 s); good jobs not done: 0")
    print(
        f"  poison stored as failed: {len(refused.failed)} of the {len(named)} with an id; left in the queue "
        f"for the DLQ: {left} (the poison without an id: {len(poison) - len(named)})"
    )


def _poison(count: int) -> list[str]:
    """``count`` poison jobs, cycling through every kind the batch tests know; those with an id get unique ones."""
    from tests.helpers.jobs import ANONYMOUS_POISON, POISON

    kinds = [body for body, _ in POISON.values()] + list(ANONYMOUS_POISON.values())
    out = []
    for n in range(count):
        body = kinds[n % len(kinds)]
        if job_identity(body) is not None:
            body = json.dumps({**json.loads(body), "id": f"poison-{n:04d}"})
        out.append(body)
    return out


def _send(queue: str, bodies: list[str]) -> None:
    sqs = clients.client("sqs")
    for start in range(0, len(bodies), 10):
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start : start + 10])]
        assert not sqs.send_message_batch(QueueUrl=queue, Entries=entries).get("Failed")


def _in_queue(queue: str, expected: int) -> int:
    """Messages still in the queue (visible or in flight), once it holds ``expected`` or after 60 s."""
    sqs = clients.client("sqs")
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    deadline = time.monotonic() + 60
    while True:  # the last batches' deletes land after their results
        attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=names)["Attributes"]
        left = sum(int(attributes[name]) for name in names)
        if left <= expected or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


if __name__ == "__main__":
    main()
