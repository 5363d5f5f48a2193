"""fnserve beside its peers on the same models and machine: raw onnxruntime (the floor), the naive FastAPI server,
BentoML and MLServer, in one run.

    make bench-peers    (or: python -m tests.bench.bench_peers, once make bench-peers has made .venv-bentoml and
                         .venv-mlserver from tests/bench/peers/*.txt; needs wrk)

- **Servers under wrk** (one thread, 16 connections, ``BENCH_BATCHING_SECONDS`` after a 2 s warm-up), for each load
  in turn: digits-accurate at batch 1 (the HTTP benchmark's JSON body), minilm-l6 tensors (16 tokens a row) and
  minilm-embed text (the batching benchmark's sentences). Each server is started fresh on a fresh port for each
  load: ``fnserve serve`` on the demo manifest, as shipped; the naive FastAPI + ORT server of that one model
  (``plain_server``, ``plain_embed_server``: a uvicorn worker per CPU); BentoML (``bentoml serve`` of
  ``tests/bench/peers/bento_service.py``) and MLServer (``mlserver start`` of ``tests/bench/peers/mlserver_models``),
  each serving the demo's three models from the same ONNX files with a worker per CPU, one onnxruntime thread
  each, and the MiniLM models batched adaptively by the framework's own batcher; MLServer also in its other
  layout, inference in its server process (``parallel_workers`` 0), since which is faster depends on the model.
  fnserve, the naive server and MLServer take the same Open Inference Protocol bodies; BentoML takes its own JSON
  of the same numbers and texts.
  Before any timing, every server's answers (the digits body, the tensor body, every sixteenth sentence) are
  checked against fnserve's: labels equal, every float within ``TOLERANCE`` of the largest magnitude of its
  output. ``BENCH_PEERS_ROUNDS`` interleaved rounds (3); each figure is the median over the rounds, with the range,
  and each ratio the median of the rounds' ratios. Requests a second are shown beside the server's CPU per
  request (the CPU time of all its processes over the requests answered), since wrk shares the cores.
- **The floor**: raw onnxruntime's CPU per row at batch 1, each request's own batch: digits in this process, one
  thread; MiniLM tensors and text (tokenize, run, mean-pool) as the batching benchmark measures them, a
  single-threaded session per CPU. ``efficiency`` is that CPU per row over the server's CPU per request: a
  server that batches can pass 1.
- **SQS jobs**: one ``BENCH_SQS_RECORDS``-record event of digits jobs (cache off) through fnserve's batch handler
  beside the naive vectorised handler and the floor (simdjson reading the numbers plus one ``session.run`` on the
  stacked rows), the SQS benchmark's pieces, ``BENCH_SQS_REPEATS`` interleaved repeats: records a second and CPU
  per record, in this process.
- **Server start**: each server's start with its default options, from its command to its first answer on the
  digits load, over the rounds. The Lambda functions' cold starts beside the naive Mangum handler, and the start
  Cloud Run and the deploy files give ``fnserve serve``, are ``bench_start``'s, under the same runtime as a deploy.

BentoML and MLServer have no SQS path: their cells in that row say so.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fnserve.bench.sweep import process_tree
from fnserve.core.host import available_cpus
from tests.bench import _jobs
from tests.bench._digits import BODY, MODEL_PATH, x1
from tests.bench._minilm import sentences, tensor_body, tensor_feed, text_body
from tests.bench._raw import RAW_SECONDS, raw
from tests.bench._servers import SECONDS, load, servers
from tests.bench._timing import shown
from tests.helpers import DEMO_MANIFEST, REPO, MemoryStore

ROUNDS = int(os.environ.get("BENCH_PEERS_ROUNDS", "3"))
PEERS = REPO / "tests" / "bench" / "peers"
BENTOML = REPO / ".venv-bentoml" / "bin" / "bentoml"
MLSERVER = REPO / ".venv-mlserver" / "bin" / "mlserver"
TOLERANCE = 1e-3  # of an output's largest magnitude: float32 sums in another order (a batch, its padding) differ
FNSERVE, NAIVE = "fnserve", "naive FastAPI + ORT"
NAIVE_SQS = "naive vectorised handler"
Arrays = dict[str, np.ndarray[Any, Any]]
METHODS = {
    "digits, JSON": "one 64-pixel digit a request (the same JSON body to fnserve, the naive server and MLServer, "
    "BentoML's own JSON of the same numbers), wrk at 16 connections against each server started fresh, rounds "
    "interleaved; CPU is the server's processes' CPU time over the requests answered.",
    "MiniLM, tensors": "one row of 16 token ids a request to all-MiniLM-L6-v2 int8, answered with its token "
    "embeddings, under the same wrk; BentoML and MLServer batch it adaptively, as fnserve does (MLServer with "
    "fnserve's settings, 64 a batch and a 2 ms window; BentoML 64 a batch within its 1 s latency goal).",
    "MiniLM, text": "one sentence a request (the benchmark's sentences in turn), tokenized, run and mean-pooled into "
    "its embedding, under the same wrk; BentoML and MLServer batch it adaptively, as in the row above.",
    "SQS jobs": "one event of digits jobs through fnserve's SQS handler and a hand-written vectorised handler in "
    "one process; the floor reads the numbers with simdjson and runs the stacked rows once.",
    "server start, default options": "each server's command to its first answer to the digits body, every round; "
    "fnserve times its layouts on the loaded models before answering, which the others do not. Lambda's cold "
    "starts and the fast start Cloud Run's file gives are python -m tests.bench.bench_start's.",
}


def pinned(name: str) -> str:
    """The peer and the version its requirements file pins: ``BentoML 1.4.40``."""
    prefix = f"{name.lower()}=="
    line = next(line for line in (PEERS / f"{name.lower()}.txt").read_text().splitlines() if line.startswith(prefix))
    return f"{name} {line.removeprefix(prefix)}"


@dataclass(frozen=True)
class Peer:
    """A server of one load: how it starts on a port, where it is asked, what it is sent, how it answers."""

    label: str
    launch: Callable[[int], tuple[list[str], dict[str, str]]]  # port -> command, environment
    path: str
    bodies: list[bytes]
    answers: Callable[[Any], Arrays]
    ports: int = 1  # MLServer takes its gRPC and metrics ports beside the HTTP one
    cwd: Path = REPO


@dataclass
class Figures:
    rate: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)


def v2_answers(answer: Any) -> Arrays:
    return {o["name"]: np.asarray(o["data"]) for o in answer["outputs"]}


def bento_digits(answer: Any) -> Arrays:
    return {name: np.asarray(answer[name]) for name in ("label", "probabilities")}


def bento_tokens(answer: Any) -> Arrays:
    return {"token_embeddings": np.asarray(answer)}


def bento_embed(answer: Any) -> Arrays:
    return {"embedding": np.asarray(answer)}


def peers(cpus: int, scratch: Path) -> dict[str, list[Peer]]:
    """The servers of each load, fnserve first (its answers are the reference)."""
    fnserve = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST)]
    naive = next(s for s in servers(cpus) if s.label == "naive FastAPI + ORT")
    naive_text = next(s for s in servers(cpus) if s.label == "naive text server")
    bento_env = {"PYTHONPATH": str(REPO), "BENTOML_DO_NOT_TRACK": "true"}
    bento = [str(BENTOML), "serve", "tests.bench.peers.bento_service:DemoModels", "--host", "127.0.0.1"]
    models = PEERS / "mlserver_models"

    def with_port(command: list[str], env: dict[str, str]) -> Callable[[int], tuple[list[str], dict[str, str]]]:
        return lambda port: ([*command, "--port", str(port)], env)

    def mlserver(workers: int) -> Callable[[int], tuple[list[str], dict[str, str]]]:
        """MLServer's two layouts: inference in a worker per CPU (its parallel inference), or in the server's own
        process (parallel_workers 0), which its docs suggest where a model is cheaper than the hop to a worker."""

        def command(port: int) -> tuple[list[str], dict[str, str]]:
            env = {
                "PYTHONPATH": f"{REPO}{os.pathsep}{models}",
                "MLSERVER_HOST": "127.0.0.1",
                "MLSERVER_HTTP_PORT": str(port),
                "MLSERVER_GRPC_PORT": str(port + 1),
                "MLSERVER_METRICS_PORT": str(port + 2),
                "MLSERVER_PARALLEL_WORKERS": str(workers),
            }
            return [str(MLSERVER), "start", str(models)], env

        return command

    texts = sentences()
    row = {name: array[0].tolist() for name, array in tensor_feed(1).items()}
    loads = {
        "digits, JSON": ("digits-accurate", [BODY.encode()], "digits", [{"input": x1.tolist()}], bento_digits),
        "MiniLM, tensors": ("minilm-l6", [tensor_body()], "tokens", [{"rows": [row]}], bento_tokens),
        "MiniLM, text": (
            "minilm-embed",
            [text_body(t) for t in texts],
            "embed",
            [{"sentences": [t]} for t in texts],
            bento_embed,
        ),
    }
    naives = {
        "digits, JSON": with_port(naive.command, {**naive.env, "PLAIN_MODEL_PATH": str(MODEL_PATH)}),
        "MiniLM, tensors": with_port(naive.command, naive.env),
        "MiniLM, text": with_port(naive_text.command, naive_text.env),
    }
    found = {}
    for what, (model, bodies, api, bento_bodies, bento_answers) in loads.items():
        v2 = f"/v2/models/{model}/infer"
        found[what] = [
            Peer(FNSERVE, with_port(fnserve, {}), v2, bodies, v2_answers),
            Peer(NAIVE, naives[what], v2, bodies, v2_answers),
            Peer(
                pinned("BentoML"),
                with_port(bento, bento_env),
                f"/{api}",
                [json.dumps(b).encode() for b in bento_bodies],
                bento_answers,
            ),
            Peer(f"{pinned('MLServer')}, {cpus} workers", mlserver(cpus), v2, bodies, v2_answers, ports=3, cwd=scratch),
            Peer(f"{pinned('MLServer')}, in process", mlserver(0), v2, bodies, v2_answers, ports=3, cwd=scratch),
        ]
    return found


@contextlib.contextmanager
def started(peer: Peer, port: int) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """``peer`` started on ``port``, once it answers its first body; and the seconds that took."""
    command, env = peer.launch(port)
    began = time.perf_counter()
    proc = subprocess.Popen(
        command,
        env={**os.environ, **env},
        cwd=peer.cwd,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}{peer.path}"
    try:
        deadline, last = time.monotonic() + 180, "no answer"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{peer.label} exited with {proc.returncode} ({' '.join(command)})")
            with contextlib.suppress(httpx.TransportError):
                # Until its models load, a server refuses (503; MLServer 400).
                answer = httpx.post(url, content=peer.bodies[0], headers={"content-type": "application/json"})
                if answer.is_success:
                    break
                last = f"{answer.status_code} {answer.text[:300]}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"{peer.label} did not answer: {last}")
            time.sleep(0.1)
        yield proc, time.perf_counter() - began
    finally:
        tree = process_tree(proc.pid) if proc.poll() is None else []
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:  # MLServer, its output to /dev/null, may hang in its shutdown
            os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session): it and its workers only
            proc.wait(timeout=20)
        # Its workers too: one still exiting takes CPU from what is measured next.
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in tree[1:]) and time.monotonic() < deadline:
            time.sleep(0.05)


def checked(peer: Peer, port: int, reference: dict[int, Arrays]) -> float:
    """Asks ``peer`` every checked body and compares its answers with ``reference`` (filled in when empty, from
    fnserve's); the largest difference found, as a fraction of its output's largest magnitude."""
    worst = 0.0
    for index in range(0, len(peer.bodies), 16):
        answer = httpx.post(
            f"http://127.0.0.1:{port}{peer.path}",
            content=peer.bodies[index],
            headers={"content-type": "application/json"},
            timeout=30,
        )
        answer.raise_for_status()
        found = peer.answers(answer.json())
        if index not in reference:
            reference[index] = found
            continue
        for name, expected in reference[index].items():
            got = found[name].ravel()
            if got.size != expected.size:
                raise AssertionError(f"{peer.label}: {name} has {got.size} values, fnserve's {expected.size}")
            if expected.dtype.kind in "iu":
                if not np.array_equal(got, expected.ravel()):
                    raise AssertionError(f"{peer.label}: {name} is {got.tolist()}, fnserve's {expected.tolist()}")
                continue
            expected = expected.astype(np.float32)  # as sent: JSON writes a float32 in fewer digits, or in more
            scale = float(np.abs(expected).max()) or 1.0
            off = float(np.abs(got.astype(np.float32) - expected.ravel()).max()) / scale
            if off > TOLERANCE:
                raise AssertionError(f"{peer.label}: {name} differs from fnserve's by {off:.4f} of its scale")
            worst = max(worst, off)
    return worst


# -- the floor --------------------------------------------------------------------------------------------


def raw_digits_ms() -> float:
    """CPU milliseconds per row of one single-threaded session running digits-accurate at batch 1."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL_PATH), sess_options=options, providers=["CPUExecutionProvider"])
    feed = {"input": x1}
    for _ in range(200):
        session.run(None, feed)
    done, began = 0, time.process_time()
    deadline = time.perf_counter() + RAW_SECONDS
    while time.perf_counter() < deadline:
        session.run(None, feed)
        done += 1
    return (time.process_time() - began) / done * 1e3


def floors(cpus: int) -> dict[str, float]:
    """Raw onnxruntime's CPU per row at batch 1 for each load, milliseconds."""
    return {
        "digits, JSON": raw_digits_ms(),
        "MiniLM, tensors": raw("tensor", 1, cpus)[1],
        "MiniLM, text": raw("text", 1, cpus)[1],
    }


# -- SQS jobs ------------------------------------------------------------------------------------------


def sqs() -> dict[str, tuple[list[float], list[float]]]:
    """Records a second and CPU microseconds per record of fnserve's batch handler, the naive vectorised handler
    and the floor, on one event of digits jobs, interleaved repeats."""
    from fnserve.adapters.lambda_.sqs import create_handler
    from fnserve.aws.events import LambdaContext, sqs_event
    from fnserve.core.execution.service import InferenceService
    from fnserve.observability.logs import logger
    from fnserve.settings import Settings

    sink = io.StringIO()
    logger.registered_handler.setStream(sink)  # type: ignore[attr-defined]
    records = _jobs.RECORDS
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    handler = create_handler(service=service, settings=Settings(manifest=DEMO_MANIFEST), store=MemoryStore())
    event = sqs_event(_jobs.bodies(records, "peers"))
    texts = [r["body"] for r in event["Records"]]
    loaded = service.registry.get("digits-accurate")
    session, names = loaded.session, list(loaded.output_names)

    def fnserve() -> None:
        assert handler(event, LambdaContext()) == {"batchItemFailures": []}

    def floor() -> None:
        session.run(names, {"input": _jobs.simdjson_floor(texts).reshape(len(texts), -1)})

    runs: dict[str, Callable[[], object]] = {
        FNSERVE: fnserve,
        NAIVE_SQS: lambda: _jobs.naive_vectorised(session, names, event, {}),
        "floor": floor,
    }
    found: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in runs}
    with contextlib.redirect_stdout(sink):  # the handler's EMF metrics
        for run in runs.values():  # a warm-up each
            run()
        for _ in range(_jobs.REPEATS):
            for label, run in runs.items():
                gc.collect()
                wall, cpu = time.perf_counter(), time.process_time()
                run()
                found[label][0].append(records / (time.perf_counter() - wall))
                found[label][1].append((time.process_time() - cpu) / records * 1e6)
                sink.seek(0)
                sink.truncate()
    return found


# -- the report -------------------------------------------------------------------------------------------


def ratio(over: Sequence[float], under: Sequence[float]) -> float:
    """The median of the rounds' ratios."""
    return statistics.median(a / b for a, b in zip(over, under, strict=True))


def report(
    cpus: int,
    labels: list[str],
    runs: dict[tuple[str, str], Figures],
    raws: dict[str, list[float]],
    worst: dict[tuple[str, str], float],
    jobs: dict[str, tuple[list[float], list[float]]],
) -> None:
    """Each load's figures, the SQS row, then all of them as one Markdown table for the docs."""
    loads = list(raws)
    print(
        f"\nfnserve beside its peers, {cpus} CPUs, wrk -t1 -c16, {SECONDS:g} s, {ROUNDS} interleaved rounds: "
        "median (range)"
    )
    for what in loads:
        fn = runs[(what, FNSERVE)]
        print(f"  {what}: raw onnxruntime CPU per row at batch 1 {shown(raws[what], '.3f')} ms")
        for label in labels:
            run = runs[(what, label)]
            agree = "the reference" if label == FNSERVE else f"answers within {worst[(what, label)]:.1e} of fnserve's"
            print(
                f"    {label:<24} {shown(run.rate, '.0f')} req/s  CPU {shown(run.cpu_ms, '.3f')} ms/req  "
                f"efficiency {ratio(raws[what], run.cpu_ms):.2f}  req/s {ratio(run.rate, fn.rate):.2f}x fnserve's  "
                f"CPU/req {ratio(run.cpu_ms, fn.cpu_ms):.2f}x fnserve's  ({agree})"
            )
    print(
        f"  SQS jobs, one {_jobs.RECORDS}-record event of digits jobs, median of {_jobs.REPEATS} "
        "(BentoML and MLServer have no SQS path):"
    )
    for label, (rates, cpus_us) in jobs.items():
        print(f"    {label:<24} {shown(rates, '.0f')} records/s  CPU {shown(cpus_us, '.1f')} us/record")
    print("  server start with default options, command to first answer (digits load, every round):")
    for label in labels:
        print(f"    {label:<24} {shown(runs[('digits, JSON', label)].start_s, '.1f')} s")

    print("\n| Load | " + " | ".join(labels) + " | raw ORT floor |")
    print("|---" * (len(labels) + 2) + "|")
    for what in loads:
        fn = runs[(what, FNSERVE)]
        cells = []
        for label in labels:
            run = runs[(what, label)]
            figures = f"{statistics.median(run.rate):.0f} req/s, {statistics.median(run.cpu_ms):.3f} ms CPU/req"
            if label == FNSERVE:
                cells.append(f"{figures} (efficiency {ratio(raws[what], run.cpu_ms):.2f})")
            else:
                cells.append(f"{figures} (**{ratio(run.cpu_ms, fn.cpu_ms):.2f}x** fnserve's CPU)")
        print(f"| {what} | " + " | ".join(cells) + f" | {statistics.median(raws[what]):.3f} ms CPU/row |")
    none = "no SQS path"
    (fn_rate, fn_cpu), (naive_rate, naive_cpu), (_, floor_cpu) = jobs[FNSERVE], jobs[NAIVE_SQS], jobs["floor"]
    print(
        f"| SQS jobs | {statistics.median(fn_rate):.0f} records/s, {statistics.median(fn_cpu):.1f} us CPU/record "
        f"(efficiency {ratio(floor_cpu, fn_cpu):.2f}) | {statistics.median(naive_rate):.0f} records/s, "
        f"{statistics.median(naive_cpu):.1f} us CPU/record (**{ratio(naive_cpu, fn_cpu):.2f}x** fnserve's CPU) | "
        + " | ".join(none for _ in labels[2:])
        + f" | {statistics.median(floor_cpu):.1f} us CPU/record |"
    )
    start_fn = runs[("digits, JSON", FNSERVE)].start_s
    cells = [f"{statistics.median(start_fn):.1f} s"]
    for label in labels[1:]:
        start = runs[("digits, JSON", label)].start_s
        cells.append(f"{statistics.median(start):.1f} s (**{ratio(start, start_fn):.2f}x** fnserve's)")
    print("| server start, default options | " + " | ".join(cells) + " | |")
    print(
        "\nIn bold, the peer's figure over fnserve's in the same rounds (the median of the rounds' ratios): above 1, "
        "the peer spends more CPU a request (or takes longer). In fnserve's column, the floor's figure over fnserve's "
        "(efficiency: raw onnxruntime's CPU per row over fnserve's CPU per request): 1 is as cheap as the floor. "
        "In the SQS row the naive column holds the hand-written vectorised handler. Reproduce: make bench-peers. "
        "Method, row by row:"
    )
    for what, sentence in METHODS.items():
        print(f"- {what}: {sentence}")


def main() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("bench_peers needs wrk (make bench-peers installs it with apt-get)")
    for tool in (BENTOML, MLSERVER):
        if not tool.exists():
            raise SystemExit(f"{tool} is missing: make bench-peers makes it from tests/bench/peers/*.txt")
    cpus = available_cpus()
    scratch = Path(tempfile.mkdtemp(prefix="fnserve-bench-peers-"))  # MLServer's working directory
    try:
        loads = peers(cpus, scratch)
        runs = {(what, p.label): Figures() for what, group in loads.items() for p in group}
        raws: dict[str, list[float]] = {what: [] for what in loads}
        references: dict[str, dict[int, Arrays]] = {what: {} for what in loads}
        worst: dict[tuple[str, str], float] = {}
        port = 18400
        for round_ in range(ROUNDS):
            for what, floor in floors(cpus).items():
                raws[what].append(floor)
            for what, group in loads.items():
                for peer in group:
                    with started(peer, port) as (proc, seconds):
                        off = checked(peer, port, references[what])
                        worst[(what, peer.label)] = max(off, worst.get((what, peer.label), 0.0))
                        found = load(proc, f"http://127.0.0.1:{port}{peer.path}", peer.bodies, 16)
                    figures = runs[(what, peer.label)]
                    figures.rate.append(found.rate)
                    figures.cpu_ms.append(found.cpu_ms)
                    figures.start_s.append(seconds)
                    print(
                        f"  round {round_ + 1}, {what}, {peer.label}: {found.rate:.0f} req/s, CPU {found.cpu_ms:.3f} "
                        f"ms/req, started in {seconds:.1f} s",
                        flush=True,
                    )
                    port += peer.ports  # a fresh port each time: no TIME_WAIT surprises
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(cpus, [p.label for p in next(iter(loads.values()))], runs, raws, worst, sqs())


if __name__ == "__main__":
    main()
