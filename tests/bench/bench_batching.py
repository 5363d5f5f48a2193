"""Adaptive batching on a transformer: MiniLM served by ``fnserve serve`` beside raw onnxruntime and the naive
servers, tensors and text, in one run.

    make bench        (or: python -m tests.bench.bench_batching; needs wrk)

All on the demo manifest's own ``minilm-l6`` (all-MiniLM-L6-v2's encoder, int8) and ``minilm-embed`` (tokenize,
that model, mean-pool), as shipped: no flags, the layout fnserve chooses at start. ``BENCH_BATCHING_ROUNDS``
interleaved rounds (3); each figure is the median, with the range over the rounds.

- **Raw onnxruntime** (the floor): one single-threaded session per CPU, each in its own process, back to back.
  Tensors: 16 tokens a row at batch 1 and batch 16. Text (tokenize + run + mean-pool, as the naive text server
  does): the benchmark's sentences at batch 1, and at batch 16 grouped by length (sentences of like length
  together, padded to the longest of each group, as fnserve's length buckets do): ``raw``, the best of the two.
  That grouping picks 16 of like length out of all the sentences, which no server can do with the 16 requests it
  holds, so ``drawn`` is what one can: 16 / CPUs sentences drawn at random at a time (what each process of a server
  at concurrency 16 holds), run in groups of the model's length buckets, or batch 1 if that is better. CPU per row
  is the processes' own CPU time over the rows they ran; capacity is rows per second.
- **Servers under wrk** (one thread, 16 connections, ``BENCH_BATCHING_SECONDS`` after a 2 s warm-up): fnserve
  (default layout; and one front process with every CPU's threads, the other layout it weighs), the naive
  FastAPI + onnxruntime server of tensors (``plain_server``) and of text (``plain_embed_server``), two uvicorn
  workers of one ORT thread each. Server CPU per request is the CPU time of the server's processes over the
  requests answered. ``x raw`` is raw CPU per row over the server's CPU per request (wrk shares the cores, so
  throughput alone would understate a server); ``x naive`` compares CPU per request to the naive server's.
- **The floor of a tensor request** at concurrency 16: what each of the CPUs' processes can hold is 16 / CPUs
  requests, so raw onnxruntime at that batch (CPU per row), plus the transport's own CPU per request (the echo
  server answering the same bytes fnserve answers, under the same wrk, two front processes on fnserve's protocol),
  plus decoding the request and encoding its answer in process (fnserve's codec, the least of five medians). No
  server of single-threaded sessions at that concurrency answers JSON over HTTP in less CPU. Each piece is
  measured apart, its caches its own; in a server the event loop's work runs on the CPU the model's runs leave,
  with the caches they leave, so ``lean``, the floor end to end, is a server: the lean batching server
  (``lean_batch_server``), which parses, batches what each process holds, runs and encodes, served as fnserve's
  front processes are, and does nothing more; ``x lean`` is its CPU per request over the server's. Of a text
  request likewise: the lean batching server with the tokenizer (one ``encode_batch`` of a batch's texts, its
  length buckets run apart, mean-pooled), against the best of raw batch 1 and raw batch 16 sorted by length.
- **Latency at concurrency 1**: fnserve's p50 beside a lone ``session.run`` at batch 1 plus the p50 of the
  naive server's HTTP round trip less its own ``session.run``: no batching window is paid when nothing else waits.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.core.host import available_cpus
from tests.bench._minilm import MODEL, sentences, tensor_body, tensor_feed, text_body
from tests.bench._raw import RAW_SECONDS, raw
from tests.bench._servers import LEAN, LEAN_TEXT, SECONDS, Run, Server, load, servers, serving
from tests.bench._timing import shown

ROUNDS = int(os.environ.get("BENCH_BATCHING_ROUNDS", "3"))
ROWS = 16


def lone_run_ms() -> float:
    """A lone ``session.run`` at batch 1 (16 tokens), median milliseconds."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), sess_options=options, providers=["CPUExecutionProvider"])
    feed = tensor_feed(1)
    times = []
    for _ in range(300):
        began = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - began)
    return statistics.median(times[50:]) * 1e3


def tensor_outputs() -> dict[str, np.ndarray[Any, Any]]:
    """The model's outputs for :func:`tensor_body` (batch 1)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, tensor_feed(1)), strict=True))


def tensor_answer(outputs: dict[str, np.ndarray[Any, Any]]) -> bytes:
    """The V2 JSON answer fnserve gives :func:`tensor_body`, of the model's ``outputs``."""
    from fnserve.core.codec.tensors import decode_request, encode_response

    return encode_response("minilm-l6", "1", outputs, decode_request(tensor_body()))[0]


def codec_ms(outputs: dict[str, np.ndarray[Any, Any]]) -> float:
    """Decoding :func:`tensor_body` and encoding its answer of ``outputs`` in process (fnserve's codec): the least of
    five medians of 200, milliseconds."""
    from fnserve.core.codec.tensors import decode_request, encode_response

    body = tensor_body()

    def once() -> float:
        began = time.perf_counter()
        encode_response("minilm-l6", "1", outputs, decode_request(body))
        return time.perf_counter() - began

    return min(statistics.median(once() for _ in range(200)) for _ in range(5)) * 1e3


def echo_cpu_ms(port: int, answer: Path, cpus: int) -> float:
    """The transport's CPU per request: the echo server (``cpus`` front processes, fnserve's protocol) answering
    ``answer``'s bytes to :func:`tensor_body` under the same wrk as the servers."""
    server = Server("echo", [sys.executable, "-m", "tests.bench.echo_server"], {}, "minilm-l6", False)
    command = [*server.command, str(port), str(cpus), "fnserve", str(answer)]
    with serving(server, port, tensor_body(), command) as proc:
        url = f"http://127.0.0.1:{port}/v2/models/minilm-l6/infer"
        return load(proc, url, [tensor_body()], 16).cpu_ms


def main() -> None:
    cpus = available_cpus()
    port = 18131
    texts = sentences()
    text_bodies = [text_body(t) for t in texts]
    raws: dict[str, list[tuple[float, float]]] = {}
    runs: dict[str, list[Run]] = {}
    ones: dict[str, list[float]] = {}
    in_flight = 16 // cpus  # what one process of a server at concurrency 16 holds
    outputs = tensor_outputs()
    answer = Path(tempfile.mkdtemp(prefix="fnserve-bench-batching-")) / "answer.json"
    answer.write_bytes(tensor_answer(outputs))
    transport: list[float] = []
    for _ in range(ROUNDS):
        for kind in ("tensor", "text"):
            for batch in (1, ROWS):
                raws.setdefault(f"{kind} b{batch}", []).append(raw(kind, batch, cpus))
        raws.setdefault(f"tensor b{in_flight}", []).append(raw("tensor", in_flight, cpus))
        raws.setdefault(f"text {in_flight} drawn", []).append(raw("flight", in_flight, cpus))
        transport.append(echo_cpu_ms(port, answer, cpus))
        port += 1
        for server in servers(cpus):
            bodies = text_bodies if server.text else [tensor_body()]
            url = f"http://127.0.0.1:{port}/v2/models/{server.model}/infer"
            with serving(server, port, bodies[0]) as proc:
                runs.setdefault(server.label, []).append(load(proc, url, bodies, 16))
                if server.label in ("fnserve, default layout", "naive FastAPI + ORT"):
                    ones.setdefault(server.label, []).append(load(proc, url, bodies, 1).p50)
            port += 1  # a fresh port each time: no TIME_WAIT surprises
    print(f"\nAdaptive batching on MiniLM int8, {cpus} CPUs, {ROUNDS} interleaved rounds: median (range)")
    print(f"  raw onnxruntime, {cpus} processes x 1 thread, {RAW_SECONDS:g} s each:")
    for key, points in raws.items():
        rate = shown([v[0] for v in points], ".0f")
        cpu = shown([v[1] for v in points], ".3f")
        print(f"    {key:<12} {rate} rows/s   CPU {cpu} ms/row")
    codec = codec_ms(outputs)
    size = answer.stat().st_size
    shutil.rmtree(answer.parent, ignore_errors=True)
    held = [raws[f"tensor b{in_flight}"][i][1] for i in range(ROUNDS)]
    tensor_floor = [held[i] + transport[i] + codec for i in range(ROUNDS)]
    b16 = [raws["tensor b16"][i][1] for i in range(ROUNDS)]
    of_b16 = shown([b16[i] / tensor_floor[i] for i in range(ROUNDS)], ".2f")
    lean = [run.cpu_ms for run in runs[LEAN]]
    lean_text = [run.cpu_ms for run in runs[LEAN_TEXT]]
    print(
        f"  the floor of a tensor request at concurrency 16, pieced together: raw b{in_flight} {shown(held, '.3f')} ms "
        f"a row (what each of {cpus} processes holds) + the transport {shown(transport, '.3f')} ms (the echo server "
        f"answering the same {size:,} B) + decoding and encoding {codec:.3f} ms = "
        f"{shown(tensor_floor, '.3f')} ms a request = {of_b16}x raw b16"
    )
    print(
        f"  the floor end to end, the {LEAN} (parse, batch what is in flight, run, encode, nothing more; its event "
        f"loop beside its runs as fnserve's): {shown(lean, '.3f')} ms a request = "
        f"{shown([b16[i] / lean[i] for i in range(ROUNDS)], '.2f')}x raw b16"
    )
    text_raw = [min(raws["text b1"][i][1], raws["text b16"][i][1]) for i in range(ROUNDS)]
    print(
        f"  and of a text request, the {LEAN_TEXT} (parse, batch, tokenize, run the length buckets, pool, encode): "
        f"{shown(lean_text, '.3f')} ms a request = "
        f"{shown([text_raw[i] / lean_text[i] for i in range(ROUNDS)], '.2f')}x raw (the best of text "
        "b1 and b16)"
    )
    text_floors = {"raw": ("text b1", "text b16"), "drawn": ("text b1", f"text {in_flight} drawn")}
    for kind, peer, floors in (
        ("tensor", "naive FastAPI + ORT", {"raw": ("tensor b16",)}),
        ("text", "naive text server", text_floors),
    ):
        floor_cpu = {name: [min(raws[k][i][1] for k in keys) for i in range(ROUNDS)] for name, keys in floors.items()}
        if kind == "tensor":
            floor_cpu["pieced"] = tensor_floor
            floor_cpu["lean"] = lean
        else:
            floor_cpu["lean"] = lean_text
        named = "; ".join(f"{n} (best of {', '.join(floors[n])}) {shown(floor_cpu[n], '.3f')}" for n in floors)
        print(f"  {kind}s over HTTP, wrk -t1 -c16, {SECONDS:g} s; raw CPU per row: {named} ms")
        for label, served in runs.items():
            if ("embed" in label or "text" in label) != (kind == "text"):
                continue
            ratios = "  ".join(
                f"{shown([cpu[i] / served[i].cpu_ms for i in range(ROUNDS)], '.2f')}x {name}"
                for name, cpu in floor_cpu.items()
            )
            per_round_naive = [runs[peer][i].cpu_ms / served[i].cpu_ms for i in range(ROUNDS)]
            print(
                f"    {label:<34} {shown([v.rate for v in served], '.0f')} req/s  "
                f"CPU {shown([v.cpu_ms for v in served], '.3f')} ms/req  "
                f"{ratios}  {shown(per_round_naive, '.2f')}x naive  "
                f"p50 {shown([v.p50 for v in served], '.1f')}  p99 {shown([v.p99 for v in served], '.1f')} ms"
            )
    lone = lone_run_ms()
    naive_http = [p50 - lone for p50 in ones["naive FastAPI + ORT"]]
    naive_one = shown(ones["naive FastAPI + ORT"], ".2f")
    print(f"  concurrency 1: a lone session.run {lone:.2f} ms; naive server p50 {naive_one} ms")
    print(
        f"    fnserve p50 {shown(ones['fnserve, default layout'], '.2f')} ms against session.run + HTTP "
        f"{shown([lone + h for h in naive_http], '.2f')} ms"
    )


if __name__ == "__main__":
    main()
