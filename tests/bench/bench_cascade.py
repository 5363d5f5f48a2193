"""Cascade benchmarks: time to the first answer, and to the final one.

    make bench        (or: python -m tests.bench.bench_cascade)

(a) The Lambda HTTP handler on API Gateway v2 events: the digits cascade (a pending request,
    its follow-up sent to a real SQS queue on a moto server; and a confident, skipped one)
    beside the fast model called alone, interleaved, medians.
(b) The final answer: from the cascade request to its follow-up result readable through
    GET /v2/results/{id}, with the follow-up function run on the received messages (the
    event source mapping's batching window, up to MaximumBatchingWindowInSeconds in AWS,
    comes on top).
(c) Jobs naming the cascade: the digits holdout ten times over, one row per job, as one SQS
    event (in-memory result store): the cascade beside every job on the accurate model and
    every job on the fast one, interleaved, medians; the share of jobs the slow model ran,
    the accuracy of each, and the slow model's runtime on the whole batch against on the
    unsure jobs only.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.adapters.lambda_.http import create_handler
from fnserve.adapters.lambda_.sqs import create_handler as create_sqs_handler
from fnserve.aws import clients
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.core.jobs.messages import job_message
from fnserve.observability.logs import logger
from fnserve.settings import Settings
from tests.bench._timing import interleaved
from tests.helpers import DEMO_HOLDOUT, REPO, MemoryStore, write_test_manifest
from tests.moto import aws_env, moto_server

ROUNDS = int(os.environ.get("BENCH_CASCADE_ROUNDS", "300"))
HOLDOUT = np.load(DEMO_HOLDOUT)


def event(model: str, row: int) -> dict[str, Any]:
    base = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    x = HOLDOUT["input"][row : row + 1]
    base["rawPath"] = base["requestContext"]["http"]["path"] = f"/v2/models/{model}/infer"
    base["body"] = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}
    )
    base["headers"]["content-length"] = str(len(base["body"]))
    return base


def jobs() -> None:
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.jobs.cascade import confidence
    from fnserve.core.jobs.processor import JobProcessor

    manifest = write_test_manifest(Path(tempfile.mkdtemp(prefix="fnserve-bench-")), cascade=True)
    service = InferenceService.from_manifest(manifest, eager=True)
    cascade = service.registry.manifest.cascades[0]
    x, y = np.tile(HOLDOUT["input"], (10, 1)), np.tile(HOLDOUT["labels"], 10)
    events = {
        name: [(f"m{i}", json.dumps(job_message(f"j{i}", name, {"input": x[i : i + 1]})), 1) for i in range(len(x))]
        for name in ("digits", "digits-accurate", "digits-fast")
    }
    stores = {name: MemoryStore() for name in events}
    processor = {name: JobProcessor(service, stores[name], ttl_seconds=60) for name in events}
    timings = interleaved([lambda n=name: processor[n].process(events[n]) for name in events], 7, warmup=1)  # type: ignore[misc]
    accuracy, answered = {}, {}
    for name, store in stores.items():
        records = [store.records[f"job#j{i}"] for i in range(len(x))]
        accuracy[name] = float(np.mean([r.outputs()["label"][0] == label for r, label in zip(records, y, strict=True)]))
        answered[name] = sum(r.model == cascade.slow for r in records)
    slow = service.registry.get(cascade.slow).session
    probabilities = service.predict(cascade.fast, {"input": x})["probabilities"]
    unsure = x[confidence(probabilities, cascade) < cascade.threshold]
    whole, only = interleaved([lambda: slow.run(None, {"input": x}), lambda: slow.run(None, {"input": unsure})], 50)
    base = statistics.median(timings[1])
    print(f"\n(c) jobs naming the cascade: {len(x)} jobs of one row in one event (7 interleaved rounds, medians)")
    for (name, label), samples in zip(
        (
            ("digits-accurate", "every job on digits-accurate"),
            ("digits", "cascade 'digits'"),
            ("digits-fast", "every job on digits-fast"),
        ),
        (timings[1], timings[0], timings[2]),
        strict=True,
    ):
        median = statistics.median(samples)
        print(f"    {label:<32}{median * 1e3:8.1f} ms  {median / base:5.2f}x   accuracy {accuracy[name]:.4f}")
    print(f"    the slow model ran {answered['digits']} of {len(x)} jobs ({answered['digits'] / len(x):.1%})")
    ran, could = statistics.median(only), statistics.median(whole)
    print(f"    its runtime: {ran * 1e3:.3f} ms on the unsure rows, {could * 1e3:.3f} ms on all ({ran / could:.2f}x)")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fnserve-bench-"))
    with moto_server(tmp / "moto.log") as url:
        os.environ.update(aws_env(url))
        clients.reset()
        from tests.helpers.clouds import create_resources

        queue_url, _ = create_resources("bench-results", "bench-payloads", "bench-followups")
        settings = Settings(
            manifest=write_test_manifest(tmp, cascade=True),
            results_table="bench-results",
            results_bucket="bench-payloads",
            followup_queue_url=queue_url,
            access_log=False,
        )
        handler = create_handler(settings=settings)
        sink = open(os.devnull, "w")  # noqa: SIM115
        logger.registered_handler.setStream(sink)  # type: ignore[attr-defined]
        from tests.helpers.cascade import SURE, UNSURE

        fast, pending, skipped = (
            event("digits-fast", int(UNSURE[0])),
            event("digits", int(UNSURE[0])),
            event("digits", int(SURE[0])),
        )
        context = LambdaContext()
        sqs = clients.client("sqs")
        body = json.dumps({"id": "bench", "model": "digits-accurate", **json.loads(pending["body"])})
        with contextlib.redirect_stdout(sink):
            alone, cascade_pending, cascade_skipped, send = interleaved(
                [
                    lambda: handler(fast, context),
                    lambda: handler(pending, context),
                    lambda: handler(skipped, context),
                    lambda: sqs.send_message(QueueUrl=queue_url, MessageBody=body),
                ],
                ROUNDS,
                warmup=20,
            )
        base = statistics.median(alone)
        print(f"(a) first answer, Lambda handler, digits batch 1 ({ROUNDS} interleaved rounds, medians)")
        print(f"    digits-fast alone                 {base * 1e3:7.3f} ms  1.00x")
        rows = (
            ("cascade, follow-up sent (pending)", cascade_pending),
            ("cascade, confident (skipped)", cascade_skipped),
            ("SQS SendMessage alone (moto)", send),
        )
        for label, samples in rows:
            median = statistics.median(samples)
            print(f"    {label:<34}{median * 1e3:7.3f} ms  {median / base:5.2f}x")
        logic = statistics.median(cascade_pending) - statistics.median(send) - base
        print(f"    pending minus (fast alone + SendMessage): {logic * 1e3:.3f} ms of cascade work")
        # Drain what (a) enqueued, then time whole follow-ups.
        sqs.purge_queue(QueueUrl=queue_url)
        worker = create_sqs_handler(settings=settings)
        finals = []

        def get(url: str) -> dict[str, Any]:
            request = json.loads((REPO / "events" / "api-http-metadata.json").read_text())
            request["rawPath"] = request["requestContext"]["http"]["path"] = url
            request["routeKey"] = request["requestContext"]["routeKey"] = "GET /v2/results/{id}"
            return json.loads(handler(request, context)["body"])  # type: ignore[no-any-return]

        with contextlib.redirect_stdout(sink):
            for row in UNSURE[:20]:
                t0 = time.perf_counter()
                response = handler(event("digits", int(row)), context)
                url = json.loads(response["body"])["parameters"]["followup_url"]
                messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)[
                    "Messages"
                ]
                worker(sqs_event([m["Body"] for m in messages]), context)
                assert get(url)["status"] == "done"
                finals.append(time.perf_counter() - t0)
                sqs.delete_message_batch(
                    QueueUrl=queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
        final = statistics.median(finals) * 1e3
        print(f"\n(b) final answer through the follow-up path, median of {len(finals)}: {final:.1f} ms")
        print("    (request + SendMessage + ReceiveMessage + follow-up function + GET /v2/results, moto on loopback)")
        clients.reset()
    jobs()


if __name__ == "__main__":
    main()
