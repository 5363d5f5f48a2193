"""gRPC beside REST (binary tensor extension, and JSON) on one ``fnserve serve``, in the same run.

    make bench        (or: python -m tests.bench.bench_grpc)

One server (``--processes 1 --workers 0 --grpc-port``, pinned to the first CPU when there are
two or more) answers three loads, each a closed loop of asyncio clients in this process
(pinned to the other CPUs): REST JSON and REST binary with aiohttp, gRPC with ``grpc.aio``
and raw contents. Each request is built once; every response is checked. Three payloads:
digits-accurate at batch 1 (256 bytes; at concurrency 1, 8 and 32), and a 1 MB and a 16 MB FP32
tensor into a model that sums its rows (the answer is small: a tensor in, a label or a score out,
as for images).
Protocols alternate in rounds; figures are the medians of the rounds.

Printed per payload and protocol: requests/s, p50 and p99 latency, and the server's CPU time
per request (from /proc: what the protocol costs the server, whatever the client's own cost)
with the capacity of one server core it implies; gRPC's measured throughput and capacity as
ratios to REST binary's. On a two-core machine the client has one core, and for gRPC it (the
Python client serialising each request) rather than the server may set the measured
throughput: the capacity column is the server's side. "grpcio echo" is the floor of any
Python gRPC server: grpcio answering fixed bytes, parsing nothing, loaded the same way;
"echo + run" also runs the digits model each call, the floor of any Python gRPC server that
runs the model in its own process, which fnserve's gRPC CPU per request is printed against.
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
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

from fnserve.adapters.grpc.proto import open_inference_grpc_pb2_grpc as pb_grpc
from fnserve.core.host import available_cpus
from tests.bench._clients import (
    ROUNDS,
    SECONDS,
    closed_loop,
    grpc_raw,
    payloads,
    rest_binary,
    rest_json,
    wait_ready,
    write_manifest,
)
from tests.bench._timing import cpu_seconds, percentile
from tests.helpers import DEMO_MANIFEST
from tests.moto import free_port

ECHO, ECHO_RUN = "grpcio echo", "echo + run"


@dataclass
class Figures:
    rps: list[float]
    p50: list[float]
    p99: list[float]
    cpu_ms: list[float]

    def row(self) -> tuple[float, float, float, float]:
        return tuple(statistics.median(v) for v in (self.rps, self.p50, self.p99, self.cpu_ms))  # type: ignore[return-value]


async def measure(
    server_pid: int, http_url: str, grpc_address: str, echoes: dict[str, tuple[int, str]]
) -> dict[str, dict[str, Figures]]:
    results: dict[str, dict[str, Figures]] = {}
    connector = aiohttp.TCPConnector(limit=0)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session,
        grpc.aio.insecure_channel(grpc_address, options=options) as channel,
        grpc.aio.insecure_channel(echoes[ECHO][1], options=options) as echo_channel,
        grpc.aio.insecure_channel(echoes[ECHO_RUN][1], options=options) as echo_run_channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        echo = pb_grpc.GRPCInferenceServiceStub(echo_channel)
        echo_run = pb_grpc.GRPCInferenceServiceStub(echo_run_channel)
        for p in payloads():
            clients = {
                "REST JSON": (rest_json(session, http_url, p), server_pid),
                "REST binary": (rest_binary(session, http_url, p), server_pid),
                "gRPC": (grpc_raw(stub, p), server_pid),
                ECHO: (grpc_raw(echo, p), echoes[ECHO][0]),
            }
            if p.model == "digits-accurate":
                clients[ECHO_RUN] = (grpc_raw(echo_run, p), echoes[ECHO_RUN][0])
            figures = {name: Figures([], [], [], []) for name in clients}
            for call, _ in clients.values():  # warm-up: connections, the first request of each
                await closed_loop(call, p.concurrency, 0.3)
            order = list(clients)
            for _ in range(ROUNDS):
                for name in order:
                    call, pid = clients[name]
                    cpu0 = cpu_seconds(pid)
                    t0 = time.perf_counter()
                    latencies = await closed_loop(call, p.concurrency, SECONDS)
                    elapsed = time.perf_counter() - t0
                    cpu = cpu_seconds(pid) - cpu0
                    f = figures[name]
                    f.rps.append(len(latencies) / elapsed)
                    f.p50.append(percentile(latencies, 50) * 1e3)
                    f.p99.append(percentile(latencies, 99) * 1e3)
                    f.cpu_ms.append(cpu / len(latencies) * 1e3)
                order.reverse()
            results[p.name] = figures
            report(p.name, figures)
    return results


def report(payload: str, figures: dict[str, Figures]) -> None:
    print(f"\n{payload}")
    print(f"  {'':<12} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'server CPU ms/req':>18} {'capacity/core':>14}")
    for name, f in figures.items():
        rps, p50, p99, cpu = f.row()
        print(f"  {name:<12} {rps:>9.1f} {p50:>9.3f} {p99:>9.3f} {cpu:>18.3f} {1e3 / cpu:>12.0f}/s")
    grpc_rps, _, _, grpc_cpu = figures["gRPC"].row()
    bin_rps, _, _, bin_cpu = figures["REST binary"].row()
    echo_cpu = figures[ECHO].row()[3]
    print(
        f"  gRPC / REST binary: measured throughput {grpc_rps / bin_rps:.2f}x, "
        f"server capacity {bin_cpu / grpc_cpu:.2f}x; echo CPU / gRPC CPU {echo_cpu / grpc_cpu:.2f}"
    )
    if ECHO_RUN in figures:
        floor = figures[ECHO_RUN].row()[3]
        print(f"  gRPC CPU per request: {grpc_cpu / floor:.2f}x the floor of echo + the model's run ({floor:.3f} ms)")


def main() -> None:
    cpus = available_cpus()
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-grpc-"))
    http_port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(write_manifest(work)), "--port", str(http_port)]
    cmd += ["--grpc-port", str(grpc_port), "--processes", "1", "--workers", "0"]
    pinned = os.environ.get("BENCH_PIN", "1") == "1" and cpus >= 2 and shutil.which("taskset") is not None
    if pinned:
        cmd = ["taskset", "-c", "0", *cmd]
        os.sched_setaffinity(0, set(range(1, cpus)))
    env = {**os.environ, "FNSERVE_MAX_REQUEST_BYTES": str(256 * 2**20), "FNSERVE_ACCESS_LOG": "false"}
    print(
        f"gRPC vs REST on one fnserve serve ({'server on CPU 0, clients on the rest' if pinned else 'unpinned'}), "
        f"{ROUNDS} rounds of {SECONDS:g} s per protocol, medians"
    )
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    digits = DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"
    echoes, servers = {}, [proc]
    for name, extra in ((ECHO, []), (ECHO_RUN, [str(digits)])):
        port = free_port()
        echo_cmd = [sys.executable, "-c", ECHO_SERVER, str(port), *extra]
        servers.append(subprocess.Popen(["taskset", "-c", "0", *echo_cmd] if pinned else echo_cmd))
        echoes[name] = (servers[-1].pid, f"127.0.0.1:{port}")
    try:
        wait_ready(proc, f"http://127.0.0.1:{http_port}")
        asyncio.run(measure(proc.pid, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", echoes))
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


# grpcio's floor: an asyncio server (uvloop, as fnserve's) answering ModelInfer with fixed bytes, parsing
# nothing: what any Python gRPC server pays per call before its own work. Given a model's path, it also runs the
# model (one thread, as fnserve's sessions) on a fixed digit each call: what any Python gRPC server that runs the
# model in its process pays (onnxruntime releases the GIL in run, and grpcio's threads then take their turn).
ECHO_SERVER = """
import asyncio, sys, grpc, uvloop
import numpy as np, onnxruntime as ort
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
answer = pb.ModelInferResponse(model_name="echo", raw_output_contents=[bytes(8)]).SerializeToString()
session = None
if len(sys.argv) > 2:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(sys.argv[2], options, providers=["CPUExecutionProvider"])
    digit = np.zeros((1, 64), np.float32)
async def infer(request, context):
    if session is not None:
        session.run(None, {"input": digit})
    return answer
async def main():
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
    handler = grpc.unary_unary_rpc_method_handler(infer, lambda b: b, lambda b: b)
    service = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})
    server.add_generic_rpc_handlers((service,))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
uvloop.run(main())
"""


if __name__ == "__main__":
    main()
