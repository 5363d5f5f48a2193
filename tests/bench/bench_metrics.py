"""What observability costs a request: ``fnserve serve`` with metrics and tracing off, metrics on, both on.

    make bench        (or: python -m tests.bench.bench_metrics)

Three servers (``--processes 1 --workers 0 --grpc-port``, digits-accurate, pinned to the first
CPU when there are two or more): ``FNSERVE_METRICS=false`` and no ``OTEL_*`` variables (off);
the default (Prometheus metrics on, tracing off); metrics and tracing on, spans exported over
OTLP/HTTP to a sink in this process that answers 200. They are loaded in turn by the same
closed-loop asyncio clients as bench_grpc (REST binary and gRPC, batch 1, concurrency 8;
clients on the other CPUs), alternating for ``BENCH_ROUNDS`` rounds. Printed: each server's
CPU time per request (from /proc, the span exporter's thread included) and requests/s,
medians of the rounds, and each configuration's cost over "off". With tracing off, no
OpenTelemetry module is imported and each request pays one attribute test.
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
from fnserve.core.host import available_cpus
from tests.bench._clients import ROUNDS, SECONDS, closed_loop, grpc_raw, payloads, rest_binary, wait_ready
from tests.bench._clients import write_manifest as write_bench_manifest
from tests.bench._timing import cpu_seconds
from tests.moto import free_port
from tests.otlp import Collector


def main() -> None:
    cpus = available_cpus()
    pinned = cpus >= 2 and shutil.which("taskset") is not None
    if pinned:
        os.sched_setaffinity(0, set(range(1, cpus)))
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-metrics-"))
    manifest = write_bench_manifest(work)
    servers = {}
    sink = Collector(keep=False)  # reads each export and answers 200: what a collector costs the sender
    configs = {
        "off": {"FNSERVE_METRICS": "false"},
        "metrics": {"FNSERVE_METRICS": "true"},
        "metrics+tracing": {
            "FNSERVE_METRICS": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        },
    }
    try:
        for config, variables in configs.items():
            http, grpc_port = free_port(), free_port()
            cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(manifest), "--port", str(http)]
            cmd += ["--grpc-port", str(grpc_port), "--processes", "1", "--workers", "0"]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROMETHEUS_"))}
            env |= {"FNSERVE_ACCESS_LOG": "false", **variables}
            cmd = ["taskset", "-c", "0", *cmd] if pinned else cmd
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers[config] = (proc, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc_port}")
            wait_ready(proc, f"http://127.0.0.1:{http}")
        print(
            f"Observability off / metrics / metrics and tracing, digits-accurate batch 1, {ROUNDS} rounds of "
            f"{SECONDS:g} s each, medians "
            f"({'servers on CPU 0, clients on the rest' if pinned else 'unpinned'})"
        )
        asyncio.run(measure(servers))
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        sink.close()
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
    print(f"  {'':<12} {'':<16} {'req/s':>9} {'server CPU µs/req':>18} {'cost over off':>14}")
    for transport in ("REST binary", "gRPC"):
        off = statistics.median(cpu[("off", transport)])
        for config in servers:
            key = (config, transport)
            used = statistics.median(cpu[key])
            print(
                f"  {transport:<12} {config:<16} {statistics.median(rps[key]):>9.0f} {used:>18.1f} "
                f"{used - off:>+10.1f} µs ({used / off:.2f}x)"
            )


if __name__ == "__main__":
    main()
