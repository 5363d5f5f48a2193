"""The closed-loop clients that gRPC and observability benchmarks load one ``fnserve serve`` with: REST JSON and
REST binary over aiohttp, gRPC with raw contents, each request built once and every answer checked; the payloads
they send, and the manifest that serves them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper

from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2_grpc as pb_grpc
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST

# The benchmarks alternate their clients in ROUNDS rounds of a closed loop SECONDS long.
SECONDS = float(os.environ.get("BENCH_LOAD_SECONDS", "3"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WIDTH = 1024  # the sum model's row: 4 KiB of FP32


@dataclass(frozen=True)
class Payload:
    name: str
    model: str
    input: str
    array: np.ndarray
    concurrency: int


def payloads() -> list[Payload]:
    digits = np.load(DEMO_HOLDOUT)["input"][:1]
    rows_1mb, rows_16mb = 2**20 // (4 * WIDTH), 2**24 // (4 * WIDTH)
    return [
        *(Payload(f"batch 1 (digits), concurrency {c}", "digits-accurate", "input", digits, c) for c in (1, 8, 32)),
        Payload("1 MB tensor", "sum", "x", np.random.default_rng(0).random((rows_1mb, WIDTH), np.float32), 4),
        Payload("16 MB tensor", "sum", "x", np.random.default_rng(1).random((rows_16mb, WIDTH), np.float32), 2),
    ]


def write_manifest(directory: Path) -> Path:
    # Each row's sum (ReduceSum takes its axes as an input since opset 13).
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    (directory / "sum.onnx").write_bytes(data)
    digits = DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"
    lines = [
        "[[models]]",
        'name = "digits-accurate"',
        f'path = "{digits}"',
        f'sha256 = "{hashlib.sha256(digits.read_bytes()).hexdigest()}"',
        "[[models]]",
        'name = "sum"',
        'path = "sum.onnx"',
        f'sha256 = "{hashlib.sha256(data).hexdigest()}"',
        "max_batch_size = 100000",
    ]
    onnx.checker.check_model(model)
    manifest = directory / "manifest.toml"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


# -- the three clients: each returns a coroutine function making one checked request --------------


def rest_json(session: aiohttp.ClientSession, url: str, p: Payload) -> Callable[[], Awaitable[None]]:
    body = orjson.dumps(
        {"inputs": [{"name": p.input, "shape": list(p.array.shape), "datatype": "FP32", "data": p.array.ravel()}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    return rest_post(session, f"{url}/v2/models/{p.model}/infer", body, {"content-type": "application/json"})


def rest_binary(session: aiohttp.ClientSession, url: str, p: Payload) -> Callable[[], Awaitable[None]]:
    blob = p.array.tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": p.input,
                    "shape": list(p.array.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    body = head + blob
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    return rest_post(session, f"{url}/v2/models/{p.model}/infer", body, headers)


def rest_post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        async with session.post(url, data=body, headers=headers) as response:
            payload = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {payload[:200]!r}")

    return call


def grpc_raw(stub: pb_grpc.GRPCInferenceServiceStub, p: Payload) -> Callable[[], Awaitable[None]]:
    request = pb.ModelInferRequest(model_name=p.model)
    request.inputs.add(name=p.input, datatype="FP32", shape=p.array.shape)
    request.raw_input_contents.append(p.array.tobytes())

    async def call() -> None:
        response = await stub.ModelInfer(request)
        if not response.raw_output_contents:
            raise RuntimeError(f"no outputs: {response}")

    return call


async def closed_loop(call: Callable[[], Awaitable[None]], concurrency: int, seconds: float) -> list[float]:
    """``concurrency`` callers back to back for ``seconds``; each request's latency (s)."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return latencies


def wait_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not become ready")
        time.sleep(0.1)
