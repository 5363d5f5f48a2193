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

import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fnserve.bench.load import run_wrk
from fnserve.bench.sweep import process_tree
from fnserve.core.host import available_cpus
from tests.bench.bench_grpc import cpu_seconds
from tests.helpers import DEMO_MANIFEST, REPO

ROUNDS = int(os.environ.get("BENCH_BATCHING_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_BATCHING_SECONDS", "10"))
RAW_SECONDS = float(os.environ.get("BENCH_BATCHING_RAW_SECONDS", "4"))
MODEL = DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx"
TOKENIZER = DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"
TOKENS = 16
ROWS = 16
LEAN = "lean batching server"  # the floor end to end (tests/bench/lean_batch_server.py)
LEAN_TEXT = "lean batching text server"
# The benchmark's sentences of 8 to 45 tokens (all but a handful of very short ones and the long concatenations).
SENTENCES: list[str] = []


def sentences() -> list[str]:
    if not SENTENCES:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(TOKENIZER))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        for line in (REPO / "tests" / "data" / "sentences.txt").read_text().splitlines():
            if 8 <= len(tokenizer.encode(line).ids) <= 45:
                SENTENCES.append(line)
    return SENTENCES


def tensor_feed(rows: int) -> dict[str, np.ndarray[Any, Any]]:
    ids = np.random.default_rng(0).integers(1000, 30000, (1, TOKENS))
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    one = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {name: np.repeat(array, rows, axis=0) for name, array in one.items()}


def tensor_body() -> bytes:
    inputs = [
        {"name": name, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
        for name, a in tensor_feed(1).items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def text_body(text: str) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}).encode()


# -- raw onnxruntime ----------------------------------------------------------------------------------


def _raw(kind: str, batch: int, seconds: float, start: Any, out: Any) -> None:
    import onnxruntime as ort

    from tests.bench._embed import embed, tokenizer_from

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), sess_options=options, providers=["CPUExecutionProvider"])
    work: list[Callable[[], object]]
    if kind == "tensor":
        feed = tensor_feed(batch)
        work = [lambda: session.run(None, feed)]
    elif kind == "text":
        tokenizer = tokenizer_from(str(TOKENIZER))
        texts = sentences()
        if batch > 1:  # like lengths together, as length buckets group them
            texts = sorted(texts, key=lambda t: len(tokenizer.encode(t).ids))
        groups = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
        work = [functools.partial(embed, tokenizer, session, group) for group in groups]
    else:  # "flight": ``batch`` sentences drawn at random, run in groups of the model's length buckets
        tokenizer = tokenizer_from(str(TOKENIZER))
        texts, buckets = sentences(), length_buckets()
        rng = np.random.default_rng(os.getpid())
        work = []
        for _ in range(200):
            drawn: dict[int, list[str]] = {}
            for i in rng.integers(0, len(texts), batch):
                length = len(tokenizer.encode(texts[i]).ids)
                drawn.setdefault(next((b for b in buckets if b >= length), length), []).append(texts[i])
            embeds = [functools.partial(embed, tokenizer, session, group) for group in drawn.values()]
            work.append(functools.partial(_each, embeds))
    for task in work[:3]:
        task()
    out.put(("ready", 0, 0.0))
    start.wait()
    done, began = 0, time.process_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work[done % len(work)]()
        done += 1
    out.put(("done", done * batch, time.process_time() - began))


def _each(tasks: Sequence[Callable[[], object]]) -> None:
    for task in tasks:
        task()


def length_buckets() -> list[int]:
    """The demo manifest's length buckets of minilm-l6."""
    import tomllib

    models = tomllib.loads(DEMO_MANIFEST.read_text())["models"]
    return sorted(next(m for m in models if m["name"] == "minilm-l6")["length_buckets"])


def raw(kind: str, batch: int, processes: int) -> tuple[float, float]:
    """Rows per second of ``processes`` single-threaded sessions together, and the CPU milliseconds per row."""
    rows, cpu = side_by_side(functools.partial(_raw, kind, batch), processes, RAW_SECONDS)
    return rows / RAW_SECONDS, cpu / rows * 1e3


def side_by_side(work: Callable[..., None], processes: int, seconds: float) -> tuple[int, float]:
    """``work(seconds, start, out)`` in ``processes`` spawned processes at once, each started once all are ready:
    the rows they ran and the CPU seconds they used, summed."""
    results = each_side_by_side(work, processes, seconds)
    return sum(r[1] for r in results), sum(r[2] for r in results)


def each_side_by_side(work: Callable[..., None], processes: int, seconds: float) -> list[tuple[str, Any, Any]]:
    """What each of ``processes`` spawned processes running ``work(seconds, start, out)`` at once put last on
    ``out``, each started once all are ready."""
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    workers = [context.Process(target=work, args=(seconds, start, out)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            out.get(timeout=300)
        start.set()
        results = [out.get(timeout=seconds + 120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
    return results


# -- servers ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    label: str
    command: list[str]
    env: dict[str, str]
    model: str  # the name requests go to
    text: bool


@dataclass(frozen=True)
class Run:
    rate: float
    cpu_ms: float  # server CPU per request
    p50: float
    p99: float


def servers(cpus: int) -> list[Server]:
    """What is served (the port comes last, from :func:`serving`)."""
    fnserve = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST)]
    uvicorn = [sys.executable, "-m", "uvicorn", "--workers", str(cpus), "--loop", "uvloop"]
    uvicorn += ["--http", "httptools", "--no-access-log", "--log-level", "warning"]
    naive = {"PLAIN_MODEL_PATH": str(MODEL), "PLAIN_THREADS": "1", "PLAIN_TOKENIZER": str(TOKENIZER)}
    lean = [sys.executable, "-m", "tests.bench.lean_batch_server"]
    text = ["--tokenizer", str(TOKENIZER), "--buckets", ",".join(map(str, length_buckets()))]
    return [
        Server("fnserve, default layout", fnserve, {}, "minilm-l6", False),
        Server("fnserve, access log off", fnserve, {"FNSERVE_ACCESS_LOG": "false"}, "minilm-l6", False),
        Server(f"fnserve, 1 process x {cpus} threads", [*fnserve, "--processes", "1"], {}, "minilm-l6", False),
        Server("naive FastAPI + ORT", [*uvicorn, "tests.bench.plain_server:app"], naive, "minilm-l6", False),
        Server(LEAN, lean, naive, "minilm-l6", False),
        Server("fnserve minilm-embed, default", fnserve, {}, "minilm-embed", True),
        Server("naive text server", [*uvicorn, "tests.bench.plain_embed_server:app"], naive, "minilm-embed", True),
        Server(LEAN_TEXT, [*lean, *text], naive, "minilm-embed", True),
    ]


@contextlib.contextmanager
def serving(
    server: Server, port: int, body: bytes, command: list[str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``server`` started on ``port`` (``command`` instead of its own with ``--port``), once it answers ``body``."""
    command = command or [*server.command, "--port", str(port)]
    env = {**os.environ, **server.env}
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}/v2/models/{server.model}/infer"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{server.label} exited with {proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                answer = httpx.post(url, content=body, timeout=30)
                if answer.status_code != 503:  # 503: listening while its models load
                    answer.raise_for_status()
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server.label} did not answer")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def load(proc: subprocess.Popen[bytes], url: str, bodies: Sequence[bytes], connections: int) -> Run:
    run_wrk(url, bodies, connections=connections, seconds=2)  # warm-up, discarded
    pids = process_tree(proc.pid)
    before = sum(cpu_seconds(pid) for pid in pids)
    found = run_wrk(url, bodies, connections=connections, seconds=SECONDS)
    used = sum(cpu_seconds(pid) for pid in pids) - before
    if found.errors:
        raise RuntimeError(f"{found.errors} of {found.requests} requests to {url} failed")
    return Run(found.rate, used / found.requests * 1e3, found.p50, found.p99)


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


def shown(values: Sequence[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


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
