"""A retrieval workload's mix against ``fnserve serve`` on the demo manifest: queries beside ingests, memory and
query latency over time.

    python -m tests.bench.bench_ingest_mix            # BENCH_MIX_SECONDS (180), BENCH_MIX_CLIENTS (12)

- **Unloaded**: one client sending one-sentence queries for ``UNLOADED_SECONDS``: the query p50 and p99 alone.
- **The mix**: ``BENCH_MIX_CLIENTS`` closed-loop clients for ``BENCH_MIX_SECONDS``, two in three sending one short
  query through ``/v1/embeddings``, one in three an ingest of 8 to 128 chunks of 5 to 250 words (as LangChain's
  ``embed_documents`` sends them). Every ``SAMPLE_SECONDS`` each server process's RSS is read from /proc.
- **The bounds checked**: no process above the Cloud Run service file's memory limit divided by its front
  processes (``infra/gcp/cloudrun/service.yaml``), RSS after the first minute within ``FLAT_MB`` of its value at
  the minute, and the query p99 under the mix within 5x its unloaded p99. Each is printed with its verdict.

The load generator shares the machine's cores with the server: the latencies include that.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from tests.embeddings import SENTENCES
from tests.helpers import DEMO_MANIFEST, REPO
from tests.servers import start_server

SECONDS = float(os.environ.get("BENCH_MIX_SECONDS", "180"))
CLIENTS = int(os.environ.get("BENCH_MIX_CLIENTS", "12"))
UNLOADED_SECONDS = 15.0
SAMPLE_SECONDS = 2.0
FLAT_MB = 100  # what RSS may still move after the first minute: a request's body and answer, the allocator's slack
WORDS = " ".join(SENTENCES).split()


def chunk(rng: random.Random) -> str:
    size = rng.randint(5, 250)
    start = rng.randrange(0, len(WORDS) - size)
    return " ".join(WORDS[start : start + size])


def tree(pid: int) -> list[int]:
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *(p for child in children for p in tree(int(child)))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cloud_run_limit_mb() -> tuple[float, int]:
    """The Cloud Run service file's memory limit (MiB) and its front processes (FNSERVE_SERVER_PROCESSES, else its
    CPUs)."""
    text = (REPO / "infra" / "gcp" / "cloudrun" / "service.yaml").read_text()
    memory = re.search(r"memory:\s*\"?(\d+)(Gi|Mi)", text)
    assert memory is not None, "no memory limit in the Cloud Run service file"
    limit = float(memory.group(1)) * (1024 if memory.group(2) == "Gi" else 1)
    processes = re.search(r"FNSERVE_SERVER_PROCESSES\s*\n\s*value:\s*\"?(\d+)", text)
    cpu = re.search(r"cpu:\s*\"?(\d+)", text)
    fronts = int(processes.group(1)) if processes else int(cpu.group(1)) if cpu else 1
    return limit, fronts


async def client(url: str, kind: str, until: float, rng: random.Random, out: dict[str, list[float]]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while time.monotonic() < until:
            if kind == "query":
                texts = [rng.choice(SENTENCES)]
            else:
                texts = [chunk(rng) for _ in range(rng.randint(8, 128))]
            started = time.perf_counter()
            answer = await http.post("/v1/embeddings", json={"model": "minilm-embed", "input": texts})
            took = time.perf_counter() - started
            status = answer.status_code
            out.setdefault(f"{kind} {status}", []).append(took)
            if status == 503:
                await asyncio.sleep(float(answer.headers.get("retry-after", "1")))  # as a client told to


async def load(url: str, seconds: float, clients: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    until = time.monotonic() + seconds
    kinds = ["query" if i % 3 else "ingest" for i in range(clients)] if clients > 1 else ["query"]
    await asyncio.gather(*(client(url, kind, until, random.Random(i), out) for i, kind in enumerate(kinds)))
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="bench-mix-"))
    proc, url = start_server(["-m", str(DEMO_MANIFEST)], directory / "serve.log", env=dict(os.environ))
    samples: list[tuple[float, dict[int, float]]] = []
    stop = threading.Event()

    def sample() -> None:
        started = time.monotonic()
        while not stop.wait(SAMPLE_SECONDS):
            samples.append((time.monotonic() - started, {p: rss_mb(p) for p in tree(proc.pid)}))

    try:
        httpx.post(f"{url}/v1/embeddings", json={"model": "minilm-embed", "input": ["warm up"]}, timeout=60)
        alone = asyncio.run(load(url, UNLOADED_SECONDS, 1))["query 200"]
        print(f"unloaded query: p50 {percentile(alone, 50):.1f} ms, p99 {percentile(alone, 99):.1f} ms, n={len(alone)}")
        start_rss = {p: rss_mb(p) for p in tree(proc.pid)}
        print("RSS at start (MB):", {p: round(v) for p, v in start_rss.items()})
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        mixed = asyncio.run(load(url, SECONDS, CLIENTS))
        stop.set()
        sampler.join()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for key in sorted(mixed):
        values = mixed[key]
        print(f"{key}: n={len(values)}, p50 {percentile(values, 50):.1f} ms, p99 {percentile(values, 99):.1f} ms")
    queries = mixed.get("query 200", [])
    limit, fronts = cloud_run_limit_mb()
    peak = max(max(rss.values()) for _, rss in samples)
    at_minute = next((rss for t, rss in samples if t >= 60), samples[-1][1])
    after = [rss for t, rss in samples if t >= 60]
    moved = max((abs(rss.get(p, 0) - at_minute[p]) for rss in after for p in at_minute), default=0.0)
    for t, rss in samples[:: max(1, len(samples) // 12)]:
        print(f"  t={t:5.0f} s RSS (MB): {[round(v) for v in rss.values()]}")
    bound = limit / fronts
    p99, alone99 = percentile(queries, 99), percentile(alone, 99)
    print(
        f"peak process RSS {peak:.0f} MB, bound {bound:.0f} MB (Cloud Run {limit:.0f} MiB / {fronts} fronts): "
        f"{'ok' if peak <= bound else 'OVER'}"
    )
    print(f"RSS after the first minute moved at most {moved:.0f} MB: {'flat' if moved <= FLAT_MB else 'NOT FLAT'}")
    print(
        f"query p99 under the mix {p99:.1f} ms = {p99 / alone99:.1f}x unloaded {alone99:.1f} ms: "
        f"{'ok' if p99 <= 5 * alone99 else 'OVER 5x'}"
    )
    print(
        f"refused 503: {sum(len(v) for k, v in mixed.items() if k.endswith(' 503'))} of "
        f"{sum(len(v) for v in mixed.values())} requests",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
