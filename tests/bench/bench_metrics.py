"""What Prometheus metrics cost a request: ``fnserve serve`` with ``FNSERVE_METRICS`` on and off, same run.

    make bench        (or: python -m tests.bench.bench_metrics)

Two servers (``--processes 1 --workers 0 --grpc-port``, digits-accurate, pinned to the first
CPU when there are two or more), one counting and one not, loaded in turn by the same
closed-loop asyncio clients as bench_grpc (REST binary and gRPC, batch 1, concurrency 8;
clients on the other CPUs), alternating for ``BENCH_ROUNDS`` rounds. Printed: each server's
CPU time per request (from /proc) and requests/s, medians of the rounds, and the cost of
metrics as the difference. Metrics on is the default: every request then updates a counter
and five histograms in the multiprocess files.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc

from fnserve.adapters.grpc.proto import open_inference_grpc_pb2_grpc as pb_grpc
from fnserve.core._cpus import available_cpus
from tests.bench.bench_grpc import (
    ROUNDS,
    SECONDS,
    closed_loop,
    cpu_seconds,
    grpc_raw,
    payloads,
    rest_binary,
    wait_ready,
)
from tests.bench.bench_grpc import write_manifest as write_bench_manifest
from tests.moto import free_port


def main() -> None:
    cpus = available_cpus()
    pinned = cpus >= 2 and shutil.which("taskset") is not None
    if pinned:
        os.sched_setaffinity(0, set(range(1, cpus)))
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-metrics-"))
    manifest = write_bench_manifest(work)
    servers = {}
    try:
        for metrics in ("true", "false"):
            http, grpc_port = free_port(), free_port()
            cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(manifest), "--port", str(http)]
            cmd += ["--grpc-port", str(grpc_port), "--processes", "1", "--workers", "0"]
            env = {**os.environ, "FNSERVE_METRICS": metrics, "FNSERVE_ACCESS_LOG": "false"}
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            cmd = ["taskset", "-c", "0", *cmd] if pinned else cmd
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers[metrics] = (proc, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc_port}")
            wait_ready(proc, f"http://127.0.0.1:{http}")
        print(
            f"Metrics on vs off, digits-accurate batch 1, {ROUNDS} rounds of {SECONDS:g} s each, medians "
            f"({'servers on CPU 0, clients on the rest' if pinned else 'unpinned'})"
        )
        asyncio.run(measure(servers))
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


async def measure(servers: dict[str, tuple[subprocess.Popen[bytes], str, str]]) -> None:
    digits = payloads()[0]
    cpu: dict[tuple[str, str], list[float]] = {}
    rps: dict[tuple[str, str], list[float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        channels = {m: grpc.aio.insecure_channel(address) for m, (_, _, address) in servers.items()}
        calls = {}
        for metrics, (_, url, _) in servers.items():
            calls[(metrics, "REST binary")] = rest_binary(session, url, digits)
            calls[(metrics, "gRPC")] = grpc_raw(pb_grpc.GRPCInferenceServiceStub(channels[metrics]), digits)
        for call in calls.values():
            await closed_loop(call, digits.concurrency, 0.3)
        order = list(calls)
        for _ in range(ROUNDS):
            for key in order:
                pid = servers[key[0]][0].pid
                cpu0, t0 = cpu_seconds(pid), time.perf_counter()
                latencies = await closed_loop(calls[key], digits.concurrency, SECONDS)
                elapsed, used = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
                cpu.setdefault(key, []).append(used / len(latencies) * 1e6)
                rps.setdefault(key, []).append(len(latencies) / elapsed)
            order.reverse()
        for channel in channels.values():
            await channel.close()
    print(f"  {'':<12} {'metrics':>8} {'req/s':>9} {'server CPU µs/req':>18}")
    for transport in ("REST binary", "gRPC"):
        for metrics in ("false", "true"):
            key = (metrics, transport)
            print(
                f"  {transport:<12} {'on' if metrics == 'true' else 'off':>8} {statistics.median(rps[key]):>9.0f} "
                f"{statistics.median(cpu[key]):>18.1f}"
            )
        on, off = statistics.median(cpu[("true", transport)]), statistics.median(cpu[("false", transport)])
        print(f"  {transport}: metrics cost {on - off:+.1f} µs a request ({on / off:.2f}x the server CPU without them)")


if __name__ == "__main__":
    main()
