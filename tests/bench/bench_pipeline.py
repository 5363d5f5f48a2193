"""Text in, embedding out: the minilm-embed pipeline beside what one would write by hand, in the same run.

    make bench        (or: python -m tests.bench.bench_pipeline; needs wrk for part a)

(a) HTTP, concurrency 16 (wrk), one sentence a request, cycling through 64 sentences of
    different lengths: ``fnserve serve`` on the demo manifest (tokenize and mean-pool steps
    around all-MiniLM-L6-v2 int8, adaptive batching with length buckets), in its default
    layout and as one front process per CPU, each batching its own requests, beside the naive
    peer (``plain_embed_server``: FastAPI, tokenizers and onnxruntime per request), run as one
    single-threaded process per CPU and as one process with every CPU's threads; the better
    of the two is the peer. Then the share of server time in each stage (the Server-Timing
    header's ``pre``, ``queue``, ``infer`` and ``post``) over concurrent requests.
(b) Batch jobs: one SQS event of ``BENCH_PIPELINE_JOBS`` text jobs (one sentence each) through
    the batch handler, beside the floor: the same texts through tokenizers and onnxruntime
    directly, 64 at a time (the model's max_batch_size), padded to each batch's longest, and
    mean-pooled with numpy, as they come and sorted by length (as fnserve orders a batch
    over the model's max_batch_size). All in this process, on the same session, results in memory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from fnserve.adapters.lambda_.sqs import create_handler
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.core.execution.service import InferenceService
from fnserve.core.host import available_cpus
from fnserve.core.jobs.messages import job_message
from fnserve.settings import Settings
from tests.bench._embed import embed, tokenizer_from
from tests.bench._wrk import running, wrk
from tests.helpers import DEMO_MANIFEST, REPO, MemoryStore

JOBS = int(os.environ.get("BENCH_PIPELINE_JOBS", "10000"))
REPEATS = int(os.environ.get("BENCH_PIPELINE_REPEATS", "3"))
MODEL = DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx"
TOKENIZER = DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"
# Ordinary sentences (the last lines of the file are two very long concatenations, for truncation tests).
SENTENCES = (REPO / "tests" / "data" / "sentences.txt").read_text().splitlines()[:240]


def body(text: str) -> str:
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]})


def stage_shares(url: str, requests: int = 320) -> dict[str, float]:
    """Milliseconds per stage, summed over ``requests`` concurrent requests (16 at a time)."""
    totals: dict[str, float] = defaultdict(float)

    def one(i: int) -> str:
        response = httpx.post(
            f"{url}/v2/models/minilm-embed/infer", content=body(SENTENCES[i % 64]), timeout=30
        ).raise_for_status()
        return response.headers["server-timing"]

    with ThreadPoolExecutor(16) as pool:
        for header in pool.map(one, range(requests)):
            for stage, ms in re.findall(r"(\w+);dur=([\d.]+)", header):
                totals[stage] += float(ms)
    return totals


def http() -> None:
    if shutil.which("wrk") is None:
        print("(a) skipped: wrk is not installed (make bench installs it with apt-get)")
        return
    cpus = available_cpus()
    bodies = [body(s) for s in SENTENCES[:64]]
    port = 18091
    fn = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST), "--port", str(port)]
    plain = [sys.executable, "-m", "uvicorn", "tests.bench.plain_embed_server:app", "--port", str(port)]
    plain += ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
    env = {"PLAIN_MODEL_PATH": str(MODEL), "PLAIN_TOKENIZER": str(TOKENIZER)}
    servers = {
        "fnserve serve (default layout, batching)": (fn, {}),
        f"fnserve serve --processes {cpus} --workers 0": ([*fn, "--processes", str(cpus), "--workers", "0"], {}),
        f"naive FastAPI, {cpus} processes x 1 thread": (
            [*plain, "--workers", str(cpus)],
            {**env, "PLAIN_THREADS": "1"},
        ),
        f"naive FastAPI, 1 process x {cpus} threads": (plain, {**env, "PLAIN_THREADS": str(cpus)}),
    }
    results = {}
    shares: dict[str, float] = {}
    for label, (cmd, extra) in servers.items():
        with running(cmd, port, env=extra, model="minilm-embed", body=body(SENTENCES[0])):
            wrk(port, bodies, model="minilm-embed", seconds=3)  # warm-up, discarded
            results[label] = wrk(port, bodies, model="minilm-embed")
            if label.startswith("fnserve serve (default"):
                shares = stage_shares(f"http://127.0.0.1:{port}")
    peer = max(rps for label, (rps, _, _) in results.items() if label.startswith("naive"))
    print(f"(a) text -> embedding over HTTP, wrk -c16, one sentence a request, {cpus} CPUs")
    for label, (rps, p50, p99) in results.items():
        ratio = f"{rps / peer:5.2f}x the peer"
        print(f"    {label:<44} {rps:7.1f} req/s  {ratio}  p50 {p50:6.1f} ms  p99/p50 {p99 / p50:4.1f}")
    total = sum(v for k, v in shares.items() if k in ("pre", "queue", "infer", "post"))
    if total:
        parts = ", ".join(f"{k} {shares.get(k, 0.0) / total:5.1%}" for k in ("pre", "queue", "infer", "post"))
        print(f"    fnserve server time by stage (320 requests, 16 at a time): {parts}")


def floor(texts: list[str], tokenizer: Tokenizer, session: ort.InferenceSession) -> np.ndarray:
    return np.concatenate([embed(tokenizer, session, texts[start : start + 64]) for start in range(0, len(texts), 64)])


def jobs() -> None:
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(JOBS)]
    bodies = [
        json.dumps(job_message(f"t-{i}", "minilm-embed", {"text": np.array([t], dtype=object)}))
        for i, t in enumerate(texts)
    ]
    event = sqs_event(bodies)
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    handler = create_handler(service=service, settings=Settings(manifest=DEMO_MANIFEST), store=MemoryStore())
    from fnserve.observability.logs import logger

    logger.registered_handler.setStream(open(os.devnull, "w"))  # type: ignore[attr-defined]  # noqa: SIM115
    tokenizer = tokenizer_from(str(TOKENIZER))
    session = service.registry.get("minilm-l6").session  # the same session, threads and all
    by_length = sorted(texts, key=len)  # what fnserve does to a batch over max_batch_size
    ours, raw, raw_sorted = [], [], []
    for _ in range(REPEATS):  # interleaved
        started = time.perf_counter()
        assert handler(event, LambdaContext()) == {"batchItemFailures": []}
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        floor(texts, tokenizer, session)  # type: ignore[arg-type]
        raw.append(time.perf_counter() - started)
        started = time.perf_counter()
        floor(by_length, tokenizer, session)  # type: ignore[arg-type]
        raw_sorted.append(time.perf_counter() - started)
    o, r, rs = (statistics.median(x) for x in (ours, raw, raw_sorted))
    print(f"\n(b) {JOBS} text jobs in one SQS event, minilm-embed, cache off (median of {REPEATS})")
    print(f"    floor: tokenizers + onnxruntime, 64 a batch   {JOBS / r:8.0f} texts/s  ({r:6.2f} s)")
    print(f"    the floor on the texts sorted by length      {JOBS / rs:8.0f} texts/s  ({rs:6.2f} s)")
    print(
        f"    fnserve batch handler                        {JOBS / o:8.0f} texts/s  ({o:6.2f} s)  "
        f"{r / o:4.2f}x the floor's rate, {rs / o:4.2f}x the sorted floor's"
    )


if __name__ == "__main__":
    http()
    jobs()
