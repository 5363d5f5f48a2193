"""Latency while DynamoDB stalls or goes down mid-load, against the same load with DynamoDB healthy.

    make bench        (or: python -m tests.bench.bench_outage)

A real ``fnserve serve`` (default workers, the digits model with the result cache on, its
shared tier in a real moto server behind a proxy that can stall or drop connections) takes
a closed-loop load of CLIENTS concurrent clients, every request a new input (a cache miss:
one DynamoDB read and one write each). Phases of the same length, in one run:

- baseline: the same server with no shared tier (no DynamoDB call at all): the floor;
- healthy: DynamoDB answers throughout (here moto, far slower than DynamoDB: for scale only);
- stalled: a quarter of the way in, DynamoDB starts accepting connections and never
  answering (the worst outage: every call waits out its timeout);
- down: a quarter of the way in, every connection to DynamoDB is dropped.

Reported per phase (for stalled and down, the requests sent after the switch only): failed
requests, p50 and p99, the p99 added over the baseline, and the p99 and slowest of
``GET /v2/health/live`` polled every 10 ms throughout. The goal: 0 failed, <= 50 ms
added p99 while DynamoDB is out, health in milliseconds.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from fnserve.aws import clients
from tests.bench._timing import percentile
from tests.faults import Mode, faulty_proxy
from tests.helpers import DEMO_HOLDOUT, write_test_manifest
from tests.helpers.clouds import create_resources
from tests.moto import aws_env, moto_server
from tests.servers import start_server

SECONDS = float(os.environ.get("BENCH_OUTAGE_SECONDS", "20"))
CLIENTS = int(os.environ.get("BENCH_OUTAGE_CLIENTS", "8"))
DIGITS = np.load(DEMO_HOLDOUT)["input"]


class Phase:
    """One phase's load: request latencies and failures, and the health checks' latencies."""

    def __init__(self, url: str, first_row: int) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failed = 0
        self.switched_at: float | None = None  # requests started before it are not counted
        self.health: list[float] = []
        self._row = first_row
        self._lock = threading.Lock()
        self.stop = threading.Event()

    def next_body(self) -> dict[str, object]:
        with self._lock:
            self._row += 1
            row = self._row
        x = DIGITS[row % len(DIGITS)].copy()
        x[0] = row  # a new input every request: a cache miss, so a DynamoDB read and write
        return {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.tolist()}]}

    def client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = http.post("/v2/models/digits-accurate/infer", json=self.next_body()).status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.perf_counter() - t0
                if self.switched_at is not None and t0 < self.switched_at:
                    continue
                with self._lock:
                    self.latencies.append(elapsed)
                    self.failed += not ok

    def prober(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stop.wait(0.01):
                t0 = time.perf_counter()
                http.get("/v2/health/live")
                self.health.append(time.perf_counter() - t0)


def run_phase(url: str, first_row: int, switch: tuple[float, Mode] | None, proxy_set: object) -> Phase:
    phase = Phase(url, first_row)
    threads = [threading.Thread(target=phase.client) for _ in range(CLIENTS)]
    threads.append(threading.Thread(target=phase.prober))
    for thread in threads:
        thread.start()
    if switch is not None:
        time.sleep(SECONDS * switch[0])
        phase.switched_at = time.perf_counter()
        with phase._lock:
            phase.latencies.clear()
            phase.failed = 0
        proxy_set(switch[1])  # type: ignore[operator]
        time.sleep(SECONDS * (1 - switch[0]))
    else:
        time.sleep(SECONDS)
    phase.stop.set()
    for thread in threads:
        thread.join()
    return phase


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fnserve-bench-"))
    with moto_server(tmp / "moto.log") as moto_url, faulty_proxy(moto_url) as proxy:
        os.environ.update(aws_env(moto_url))
        clients.reset()
        create_resources("bench-results", "bench-payloads", "bench-jobs")
        env = {
            **os.environ,
            **aws_env(proxy.url),
            "FNSERVE_RESULTS_TABLE": "bench-results",
            "FNSERVE_ACCESS_LOG": "false",
        }
        manifest = write_test_manifest(tmp, cache_ttl=3600)
        phases = {}
        plain = {k: v for k, v in env.items() if k != "FNSERVE_RESULTS_TABLE"}
        server, url = start_server(["-m", str(manifest)], tmp / "plain.log", env=plain)
        try:
            run_phase(url, 0, None, proxy.set)  # warm-up
            phases["baseline"] = run_phase(url, 1_000_000, None, proxy.set)
        finally:
            server.terminate()
            server.wait(timeout=15)
        server, url = start_server(["-m", str(manifest)], tmp / "server.log", env=env)
        try:
            run_phase(url, 0, None, proxy.set)  # warm-up
            for n, (name, mode) in enumerate([("healthy", None), ("stalled", "stall"), ("down", "down")]):
                proxy.set("forward")
                time.sleep(11)  # past the breaker's cooldown: each phase starts with the cache tier in use
                switch = (0.25, mode) if mode is not None else None
                phases[name] = run_phase(url, (n + 2) * 1_000_000, switch, proxy.set)
        finally:
            server.terminate()
            server.wait(timeout=15)
    base_p99 = percentile(phases["baseline"].latencies, 99)
    print(f"fnserve serve, digits-accurate with the result cache on, {CLIENTS} clients, {SECONDS:.0f} s per phase")
    print(
        f"{'phase':<9} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8} {'added p99':>10} "
        f"{'health p99 / max ms':>20}"
    )
    for name, phase in phases.items():
        p99 = percentile(phase.latencies, 99)
        print(
            f"{name:<9} {len(phase.latencies):>9} {phase.failed:>7} "
            f"{statistics.median(phase.latencies) * 1e3:>8.2f} {p99 * 1e3:>8.2f} "
            f"{(p99 - base_p99) * 1e3:>+9.1f}  "
            f"{percentile(phase.health, 99) * 1e3:>9.1f} / {max(phase.health) * 1e3:.1f}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
