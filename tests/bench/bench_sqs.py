"""SQS batch benchmarks: the vectorised handler against a per-record loop, and DynamoDB calls.

    make bench        (or: python -m tests.bench.bench_sqs)

(a) One 10,000-record SQS event of digits-accurate jobs (cache off), through the batch
    handler with JSON bodies and with binary ones (``binary_data``, what ``fnserve submit``
    sends), beside a per-record loop over the same records that parses each record and
    calls the service at batch 1, a naive vectorised handler (every body parsed with orjson,
    one ``session.run`` on the stacked rows, a result a record), and the floors: the JSON bodies'
    numbers stacked into one array by orjson (what the naive handler parses with) and by simdjson
    (what fnserve reads them with), each in chunks of ``CHUNK`` bodies as fnserve reads them (faster
    than all at once), and ``session.run`` on the stacked rows. All store
    results in the same in-memory store, so the figure is the handler's own work (a real table
    adds the BatchWriteItem round trips).
(b) DynamoDB calls per 1,000 records with the cache on, against a real moto server: a
    first pass (all misses) and a second pass of the same inputs under new job ids (all hits).
"""

from __future__ import annotations

import collections
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fnserve.adapters.lambda_.sqs import create_handler, records_of
from fnserve.aws import clients
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.messages import parse_job
from fnserve.core.jobs.results import ResultRecord, job_key
from fnserve.settings import Settings
from tests.bench._jobs import RECORDS, REPEATS, bodies, naive_vectorised, parse_floor, simdjson_floor
from tests.helpers import DEMO_MANIFEST, MemoryStore, write_test_manifest
from tests.moto import aws_env, moto_server


def per_record_loop(service: InferenceService, event: dict[str, Any], store: MemoryStore) -> None:
    """What a straightforward handler does: one record, one parse, one batch-1 call, one result."""
    for _, body, _count in records_of(event):
        job = parse_job(body)
        outputs = service.predict(job.model, job.inputs, version=job.version)
        store.put([ResultRecord.done(job_key(job.id), job.model, "1", outputs, now=int(time.time()), ttl=3600)])


def vectorised_vs_loop() -> None:
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    event = sqs_event(bodies(RECORDS, "bench"))
    handler = create_handler(service=service, settings=Settings(manifest=DEMO_MANIFEST), store=MemoryStore())
    sink = open(os.devnull, "w")  # noqa: SIM115
    from contextlib import redirect_stdout

    from fnserve.observability.logs import logger

    logger.registered_handler.setStream(sink)  # type: ignore[attr-defined]
    binary_event = sqs_event(bodies(RECORDS, "bench-bin", binary=True))
    fast, fast_binary, slow, parse, simd, naive, run = [], [], [], [], [], [], []
    texts = [r["body"] for r in event["Records"]]
    loaded = service.registry.get("digits-accurate")
    session, names = loaded.session, list(loaded.output_names)
    stacked = np.asarray([orjson.loads(text)["inputs"][0]["data"] for text in texts], np.float32)
    with redirect_stdout(sink):
        for _ in range(REPEATS):  # interleaved; each from a collected heap, so none pays for another's garbage
            gc.collect()
            t0 = time.perf_counter()
            assert handler(event, LambdaContext()) == {"batchItemFailures": []}
            fast.append(time.perf_counter() - t0)
            gc.collect()
            t0 = time.perf_counter()
            assert handler(binary_event, LambdaContext()) == {"batchItemFailures": []}
            fast_binary.append(time.perf_counter() - t0)
            gc.collect()
            t0 = time.perf_counter()
            per_record_loop(service, event, MemoryStore())
            slow.append(time.perf_counter() - t0)
            gc.collect()
            gc.disable()  # the floor at its best, as the handler parses (it pauses the collector)
            t0 = time.perf_counter()
            parse_floor(texts)
            parse.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            simdjson_floor(texts)
            simd.append(time.perf_counter() - t0)
            gc.enable()
            gc.collect()
            t0 = time.perf_counter()
            session.run(names, {"input": stacked})
            run.append(time.perf_counter() - t0)
            gc.collect()
            t0 = time.perf_counter()
            naive_vectorised(session, names, event, {})
            naive.append(time.perf_counter() - t0)
    f, b, s, p, j, r, n = (statistics.median(x) for x in (fast, fast_binary, slow, parse, simd, run, naive))
    json_size = sum(len(t) for t in texts) / RECORDS
    binary_size = sum(len(r["body"]) for r in binary_event["Records"]) / RECORDS
    print(f"(a) SQS handler, one {RECORDS}-record event, digits-accurate, cache off (median of {REPEATS})")
    print(f"    floor: orjson.loads + one array     {RECORDS / p:10.0f} records/s  ({p * 1e3:7.1f} ms)  (in chunks)")
    print(f"    floor: simdjson numbers, one array  {RECORDS / j:10.0f} records/s  ({j * 1e3:7.1f} ms)  (in chunks)")
    print(f"    floor: session.run, stacked rows    {RECORDS / r:10.0f} records/s  ({r * 1e3:7.1f} ms)")
    print(f"    per-record loop                     {RECORDS / s:10.0f} records/s  ({s * 1e3:7.1f} ms)")
    print(f"    naive vectorised handler            {RECORDS / n:10.0f} records/s  ({n * 1e3:7.1f} ms)")
    print(
        f"    fnserve, JSON bodies ({json_size:.0f} B)     {RECORDS / f:10.0f} records/s  ({f * 1e3:7.1f} ms)"
        f"  {s / f:4.1f}x the loop, {n / f:4.2f}x the naive vectorised handler, {j / f:4.2f}x the simdjson floor's"
        f" rate, {(j + r) / f:4.2f}x its + run's"
    )
    print(
        f"    fnserve, binary bodies ({binary_size:.0f} B)   {RECORDS / b:10.0f} records/s  ({b * 1e3:7.1f} ms)"
        f"  {s / b:4.1f}x the loop, {n / b:4.2f}x the naive vectorised handler, {p / b:4.2f}x the orjson floor's rate"
    )
    print(
        f"    a JSON handler at the floors (simdjson + run, {(j + r) * 1e3:.1f} ms) would be {n / (j + r):4.2f}x the"
        f" naive vectorised handler; orjson + run ({(p + r) * 1e3:.1f} ms), {n / (p + r):4.2f}x"
    )


def dynamodb_calls() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fnserve-bench-"))
    with moto_server(tmp / "moto.log") as url:
        os.environ.update(aws_env(url))
        clients.reset()
        from tests.helpers.clouds import create_resources

        create_resources("bench-results", "bench-payloads", "bench-jobs")
        settings = Settings(
            manifest=write_test_manifest(tmp, cache_ttl=3600),
            results_table="bench-results",
            results_bucket="bench-payloads",
        )
        calls: collections.Counter[str] = collections.Counter()

        def count(model: Any, params: dict[str, Any], **_: Any) -> None:
            calls.update([model.name])
            if model.name == "BatchWriteItem":
                calls["items"] += sum(len(v) for v in params["RequestItems"].values())

        clients.client("dynamodb").meta.events.register("before-parameter-build.dynamodb.*", count)
        n = 1000
        print(f"\n(b) DynamoDB calls per {n} records (distinct inputs), cache on (moto server)")
        passes = (("first pass (misses)", "p1"), ("same inputs, new ids, new container (hits)", "p2"))
        for label, prefix in passes:
            handler = create_handler(settings=settings)  # a new container: empty in-process tier
            calls.clear()
            event = sqs_event(bodies(n, prefix, unique=True))
            response = handler(event, LambdaContext())
            assert response == {"batchItemFailures": []}, response
            gets, writes = calls["BatchGetItem"], calls["BatchWriteItem"]
            others = {k: v for k, v in calls.items() if k not in ("BatchGetItem", "BatchWriteItem", "items")}
            print(
                f"    {label:<44} BatchGetItem {gets:3d} ({n / max(gets, 1):.0f} records each)  "
                f"BatchWriteItem {writes:3d} ({calls['items'] / max(writes, 1):.0f} items each)  "
                f"other calls {others or 0}"
            )
        clients.reset()


if __name__ == "__main__":
    vectorised_vs_loop()
    dynamodb_calls()
