"""Google Cloud benchmarks: the HTTP function's overhead beside the Lambda handler's, and the Pub/Sub job
function's Redis traffic.

    make bench        (or: python -m tests.bench.bench_gcp; part (b) needs redis-server)

(a) In-process, interleaved, digits-accurate at batch 1 and 4 in JSON: raw ``session.run`` (the
    floor); the Lambda API handler fed an API Gateway v2 event (Mangum into the V2 app); the
    HTTP function as functions-framework serves it (its ASGI app, from
    ``functions/gcp_api/main.py``, called with the request's ASGI scope; the HTTP server's own
    parsing is left out on both sides). p50 overhead over the floor of each, and the
    function's overhead minus the handler's.
(b) 1,000 digits jobs as concurrent Pub/Sub events through the job function's gatherer and
    processor into a real redis-server: batches, Redis commands and round trips per 1,000 jobs
    on first delivery and on redelivery (every job delivered again), and jobs/s in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

from fnserve.aws.events import LambdaContext
from tests.bench._timing import interleaved, percentile
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO, post_scope
from tests.moto import free_port

MODEL = "digits-accurate"
MODEL_PATH = DEMO_MANIFEST.parent / MODEL / "1" / "model.onnx"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3000"))
JOBS = 1000
DIGITS = np.load(DEMO_HOLDOUT)["input"]


def asgi_caller(app: Any, path: str, body: bytes) -> Any:
    """A function making one POST through ``app`` on a private event loop; returns the status."""
    loop = asyncio.new_event_loop()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = post_scope(path, headers)

    async def call() -> int:
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        return int(sent[0]["status"])

    return lambda: loop.run_until_complete(call())


def function_overhead() -> None:
    os.environ["FNSERVE_MANIFEST"] = str(DEMO_MANIFEST)
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "fnserve")
    from functions_framework.aio import create_asgi_app

    from fnserve.adapters.lambda_.http import create_handler
    from fnserve.observability import logs

    handler = create_handler()
    app = create_asgi_app(target="infer", source=str(REPO / "functions" / "gcp_api" / "main.py"))
    logs.cloud_logging(False)  # the function switched the shared logger to Cloud Logging's shape: each its own
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives for the whole benchmark
    stream = logs.logger.registered_handler
    assert isinstance(stream, logging.StreamHandler)
    stream.setStream(sink)  # logs are written, as on either cloud, just not to the terminal
    session = ort.InferenceSession(str(MODEL_PATH), providers=["CPUExecutionProvider"])
    context = LambdaContext()
    template = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    print(f"(a) {MODEL}, JSON, in-process, access log on ({ROUNDS} interleaved rounds): p50 overhead over raw")
    print("    session.run of the Lambda handler (API Gateway v2 event) and of the Cloud Functions HTTP function")
    for batch in (1, 4):
        x = DIGITS[:batch]
        body = {"inputs": [{"name": "input", "shape": [batch, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}
        event = copy.deepcopy(template)
        event["body"] = json.dumps(body)
        event["headers"]["content-length"] = str(len(event["body"]))
        post = asgi_caller(app, f"/v2/models/{MODEL}/infer", event["body"].encode())
        with contextlib.redirect_stdout(sink):  # EMF blobs go to stdout
            assert handler(event, context)["statusCode"] == 200 and post() == 200
            raw, aws, gcp = interleaved(
                [lambda x=x: session.run(None, {"input": x}), lambda e=event: handler(e, context), post],
                ROUNDS,
                warmup=200,
            )
        raw_p50, aws_p50, gcp_p50 = (statistics.median(t) * 1e3 for t in (raw, aws, gcp))
        print(
            f"    batch {batch}: raw {raw_p50:.3f} ms | Lambda handler +{aws_p50 - raw_p50:.3f} ms"
            f" (p99 {percentile(aws, 99) * 1e3:.3f}) | Cloud Functions +{gcp_p50 - raw_p50:.3f} ms"
            f" (p99 {percentile(gcp, 99) * 1e3:.3f}) | function - handler {gcp_p50 - aws_p50:+.3f} ms"
        )


@contextlib.contextmanager
def redis_server() -> Iterator[str | None]:
    server = shutil.which("redis-server")
    if server is None:
        yield None
        return
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling a starting server: no condition to wait on but its answer
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()


def job_traffic() -> None:
    from fnserve import bootstrap
    from fnserve.adapters.gcp.jobs import Gatherer
    from fnserve.core.jobs.messages import job_message
    from fnserve.settings import Settings
    from fnserve.stores.redis import RedisResultStore

    with redis_server() as url:
        if url is None:
            print("(b) skipped: redis-server is not installed (make test-servers installs it)")
            return
        settings = Settings(manifest=str(DEMO_MANIFEST), results=url)
        store = bootstrap.result_store(settings)
        assert isinstance(store, RedisResultStore)
        processor = bootstrap.job_processor(settings, store, bootstrap.build_service(settings, store))
        bodies = [
            orjson.dumps(job_message(f"bench-{i}", MODEL, {"input": DIGITS[i % 300 : i % 300 + 1]}))
            for i in range(JOBS)
        ]
        print(f"(b) {JOBS} {MODEL} jobs as concurrent Pub/Sub events, gathered (5 ms), results in redis-server")
        for attempt, what in ((1, "first delivery"), (2, "redelivered  ")):
            gatherer = Gatherer(processor, window=settings.jobs_gather_ms / 1000, max_jobs=settings.jobs_max_batch)
            sizes: list[int] = []
            process = processor.process

            def counted(records: Any, process: Any = process, sizes: list[int] = sizes) -> Any:
                sizes.append(len(records))
                return process(records)

            processor.process = counted  # type: ignore[method-assign]
            store.client.config_resetstat()

            async def deliver(gatherer: Gatherer = gatherer, attempt: int = attempt) -> list[bool]:
                events = (gatherer.redeliver((f"m{i}", body, attempt)) for i, body in enumerate(bodies))
                return await asyncio.gather(*events)

            started = time.perf_counter()
            assert not any(asyncio.run(deliver()))
            seconds = time.perf_counter() - started
            processor.process = process  # type: ignore[method-assign]
            stats = store.client.info("commandstats")
            calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if "config" not in k}
            print(
                f"    {what}: {len(sizes)} batch(es) of {max(sizes)}; Redis per {JOBS} jobs: "
                f"{calls.get('mget', 0)} MGET, {calls.get('set', 0)} SET (pipelined: one round trip a batch); "
                f"{JOBS / seconds:,.0f} jobs/s in-process"
            )


if __name__ == "__main__":
    function_overhead()
    job_traffic()
