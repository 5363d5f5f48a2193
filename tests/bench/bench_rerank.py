"""Reranking and text classification beside their peers: fnserve through Cohere's rerank API and TEI's /predict,
the naive FastAPI server, fastembed's cross-encoder in a FastAPI server, and raw onnxruntime at its best cut of the
same pairs, on the same files.

    make bench-peers    (or: python -m tests.bench.bench_rerank, once make bench-peers has made .venv-fastembed and
                         .venv-export; needs wrk)

- **The rerank row**: ``REQUESTS`` requests, each a query (a few words of a demo sentence) and 16 to 64 documents
  drawn from the embeddings benchmark's mix (sentences and passages of up to 256 tokens), scored by the demo's
  ``minilm-rerank`` (int8, a pair cut to 512 tokens). **The classify row**: one text a request, the same mix, scored
  by a DistilBERT classifier of three labels that ``fnserve import`` makes of a random-initialised folder
  (``infra/models/make_hub_models.py``; its speed is the architecture's, its labels meaningless), cut to its 128
  tokens.
- **The floor**: raw onnxruntime (tokenize, run, as the naive server does), one single-threaded session per CPU,
  the pairs (or texts) of what one process of a server holds at 16 connections (16 / CPUs requests drawn at random)
  cut into runs by each rule of ``CUTS`` (one a run, a whole request padded to its longest, or sorted by length
  within a budget of padded tokens, or of tokens and attention; 64 rows at most, ``MIN_FILL`` of the padded tokens
  real), every rule's runs of the same draws side by side in one process, each timed on its thread; the best rule
  is the floor.
- **Servers under wrk** (one thread, 16 connections, ``BENCH_RERANK_SECONDS`` after a 2 s warm-up): ``fnserve serve``
  on a manifest of the demo's models and the classifier, through ``POST /v1/rerank`` and TEI's ``POST
  /tei/NAME/predict``; the naive FastAPI + tokenizers + onnxruntime server (``plain_rerank_server``: a request's
  pairs one batch padded to its longest) and fastembed's ``TextCrossEncoder`` serving the same file from FastAPI
  (``peers/fastembed_rerank_server.py``; it has no classifier), each a uvicorn worker per CPU of one ORT thread.
  Before any timing each server's scores of every eighth request's documents (to 3 places) or label of every
  eighth text are checked against fnserve's. CPU per pair is the CPU time of the server's processes over the pairs
  answered (a request wrk counts failed, fnserve's refusal of what its queue cannot hold in time, answers none),
  over the floor's best cut.

``BENCH_RERANK_ROUNDS`` interleaved rounds (2); each figure is the median, with the range over the rounds.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fnserve.bench.load import run_wrk
from fnserve.bench.sweep import process_tree
from fnserve.core.execution.embeddings import TokenBudget, token_runs
from fnserve.core.host import available_cpus
from fnserve.core.models.manifest import load_manifest
from tests.bench._minilm import mix
from tests.bench._raw import each_side_by_side
from tests.bench._servers import Run
from tests.bench._timing import cpu_seconds, shown
from tests.helpers import DEMO_MANIFEST, REPO

ROUNDS = int(os.environ.get("BENCH_RERANK_ROUNDS", "2"))
SECONDS = float(os.environ.get("BENCH_RERANK_SECONDS", "10"))
RAW_SECONDS = float(os.environ.get("BENCH_RERANK_RAW_SECONDS", "3"))
REQUESTS = 48
CONNECTIONS = 16
MAX_ROWS = 64
SCRATCH = REPO / ".bench" / "rerank"
EXPORT_PYTHON = REPO / ".venv-export" / "bin" / "python"
FASTEMBED_VENV = REPO / ".venv-fastembed"
RERANKER = "minilm-rerank"
CLASSIFIER = "distilbert-classify"
NAIVE = "naive FastAPI + tokenizers + ORT"
CUTS: dict[str, TokenBudget | None] = {
    "batch 1": None,
    "a request a run": None,  # the naive server's: its pairs padded to its longest (the classify row: batch 1)
    "2048 tokens": TokenBudget(tokens=2048),
    "1024 tokens, 32768 attention": TokenBudget(tokens=1024, attention=32768),
    "1024 tokens, 262144 attention": TokenBudget(tokens=1024, attention=262144),  # the demo reranker's budget
}
DRAWS = 50


@dataclass(frozen=True)
class Workload:
    """A row's model and its requests: each a list of (first, second) pairs (second None: one text)."""

    name: str  # the pipeline's
    model: Path
    tokenizer: Path
    max_length: int
    requests: list[list[tuple[str, str | None]]]
    labels: tuple[str, ...] = ()

    @property
    def pairs(self) -> int:
        return sum(len(r) for r in self.requests)


# -- the models and requests --------------------------------------------------------------------------


def manifest() -> Path:
    """The demo's models and the classifier imported beside them (made once, in .bench/rerank)."""
    served = SCRATCH / "models"
    if (served / "manifest.toml").exists() and CLASSIFIER in (served / "manifest.toml").read_text():
        return served / "manifest.toml"
    shutil.rmtree(SCRATCH, ignore_errors=True)
    shutil.copytree(DEMO_MANIFEST.parent, served)
    script = REPO / "infra" / "models" / "make_hub_models.py"
    sentences = REPO / "tests" / "data" / "sentences.txt"
    subprocess.run(
        [str(EXPORT_PYTHON), str(script), str(SCRATCH / "hub"), "--sentences", str(sentences)]
        + ["--only", "distilbert-3labels"],
        check=True,
    )
    folder, target = SCRATCH / "hub" / "distilbert-3labels", served / "manifest.toml"
    command = [sys.executable, "-m", "fnserve", "import", str(folder), "-m", str(target), "--name", CLASSIFIER]
    subprocess.run([*command, "--export-python", str(EXPORT_PYTHON)], check=True)
    return target


def workloads(path: Path) -> list[Workload]:
    found = load_manifest(path)
    models = {m.name: m for m in found.models}
    rows = []
    rng = random.Random(3)
    texts = mix()
    for name in (RERANKER, CLASSIFIER):
        pipeline = next(p for p in found.pipelines if p.name == name)
        tokenize = pipeline.pre[0]
        model = Path(found.base_dir) / models[pipeline.model].path
        tokenizer = Path(found.base_dir) / tokenize.tokenizer  # type: ignore[union-attr]
        length = tokenize.max_length  # type: ignore[union-attr]
        if name == RERANKER:
            requests: list[list[tuple[str, str | None]]] = []
            for _ in range(REQUESTS):
                words = rng.choice(texts).split()
                query = " ".join(words[: rng.randint(3, 8)])
                requests.append([(query, d) for d in rng.sample(texts, rng.randint(16, 64))])
            rows.append(Workload(name, model, tokenizer, length, requests))
        else:
            labels_file = Path(found.base_dir) / pipeline.post[-1].labels  # type: ignore[union-attr]
            labels = tuple(labels_file.read_text().split())
            rows.append(Workload(name, model, tokenizer, length, [[(t, None)] for t in texts], labels))
    return rows


def single_threaded(row: Workload) -> tuple[Any, Any]:
    import onnxruntime as ort

    from tests.bench._embed import pair_tokenizer_from

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(row.model), sess_options=options, providers=["CPUExecutionProvider"])
    return pair_tokenizer_from(str(row.tokenizer), row.max_length), session


# -- the floor ----------------------------------------------------------------------------------------


def cut(row: Workload, lengths: list[int], requests: Sequence[int], rule: str) -> list[list[tuple[str, str | None]]]:
    """The pairs of ``requests`` (indices into the row's) in the runs ``rule`` cuts them into."""
    pairs = [(r, i) for r in requests for i in range(len(row.requests[r]))]
    starts = list(itertools.accumulate(len(r) for r in row.requests))
    length = {(r, i): lengths[starts[r] - len(row.requests[r]) + i] for r, i in pairs}
    budget = CUTS[rule]
    if rule == "a request a run":
        return [row.requests[r] for r in requests]
    order = sorted(pairs, key=length.__getitem__)
    if budget is None:
        return [[row.requests[r][i]] for r, i in order]
    ends = token_runs([length[p] for p in order], budget, MAX_ROWS)
    return [[row.requests[r][i] for r, i in order[a:b]] for a, b in itertools.pairwise([0, *ends])]


def _floors(row: Workload, held: int, seconds: float, start: Any, out: Any) -> None:
    """One single-threaded session running every rule's runs of the same pairs in turn, its thread's CPU timed per
    rule: the pairs of ``held`` requests drawn at random, what one process of a server holds at once."""
    from tests.bench._embed import logits

    tokenizer, session = single_threaded(row)
    flat = [pair for request in row.requests for pair in request]
    lengths = [sum(e.attention_mask) for e in tokenizer.encode_batch([p if p[1] else p[0] for p in flat])]
    rng = random.Random()
    groups = [rng.sample(range(len(row.requests)), held) for _ in range(DRAWS)]
    plans = {rule: [cut(row, lengths, g, rule) for g in groups] for rule in CUTS}

    def run(pairs: list[tuple[str, str | None]]) -> None:
        firsts = [p[0] for p in pairs]
        logits(tokenizer, session, firsts, [p[1] for p in pairs] if pairs[0][1] is not None else None)  # type: ignore[misc]

    for runs in plans.values():
        for pairs in runs[0][:8]:
            run(pairs)
    out.put(("ready", 0, 0.0))
    start.wait()
    rows, used = dict.fromkeys(CUTS, 0), dict.fromkeys(CUTS, 0.0)
    names = list(CUTS)
    deadline, done = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline or done == 0:
        random.shuffle(names)
        for name in names:
            began = time.thread_time()
            for pairs in plans[name][done % len(groups)]:
                run(pairs)
                rows[name] += len(pairs)
            used[name] += time.thread_time() - began
        done += 1
    out.put(("done", rows, used))


def floors(row: Workload, held: int, processes: int) -> dict[str, float]:
    """CPU milliseconds per pair of each rule, ``processes`` single-threaded sessions side by side."""
    results = each_side_by_side(functools.partial(_floors, row, held), processes, RAW_SECONDS * len(CUTS))
    return {name: sum(r[2][name] for r in results) / sum(r[1][name] for r in results) * 1e3 for name in CUTS}


# -- servers ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    label: str
    command: list[str]
    env: dict[str, str]
    path: str  # the route requests go to
    body: Callable[[list[tuple[str, str | None]]], bytes]
    ranks: Callable[[Any], list[Any]]  # an answer as what is compared: the documents' scores, or the top label


def rerank_body(model: str | None) -> Callable[[list[tuple[str, str | None]]], bytes]:
    def body(pairs: list[tuple[str, str | None]]) -> bytes:
        doc: dict[str, Any] = {"query": pairs[0][0], "documents": [p[1] for p in pairs]}
        return json.dumps({"model": model, **doc} if model else doc).encode()

    return body


def predict_body(pairs: list[tuple[str, str | None]]) -> bytes:
    return json.dumps({"inputs": pairs[0][0]}).encode()


def order_of(answer: Any) -> list[Any]:
    """Each document's score, in the request's order."""
    results = sorted(answer["results"], key=lambda r: r["index"])
    return [round(r["relevance_score"], 3) for r in results]


def top_label(answer: Any) -> list[Any]:
    return [answer[0]["label"]]


def peers(row: Workload, served: Path, cpus: int) -> list[Peer]:
    workers = ["--workers", str(cpus), "--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    workers += ["--log-level", "warning"]
    fnserve = [sys.executable, "-m", "fnserve", "serve", "-m", str(served)]  # as a user starts it
    naive_env = {
        "PLAIN_MODEL_PATH": str(row.model),
        "PLAIN_TOKENIZER": str(row.tokenizer),
        "PLAIN_MAX_LENGTH": str(row.max_length),
        "PLAIN_LABELS": ",".join(row.labels),
        "PLAIN_THREADS": "1",
    }
    naive = [sys.executable, "-m", "uvicorn", *workers, "tests.bench.plain_rerank_server:app"]
    if row.name == CLASSIFIER:
        return [
            Peer("fnserve TEI /predict", fnserve, {}, f"/tei/{CLASSIFIER}/predict", predict_body, top_label),
            Peer(NAIVE, naive, naive_env, "/predict", predict_body, top_label),
        ]
    found = [
        Peer("fnserve /v1/rerank", fnserve, {}, "/v1/rerank", rerank_body(RERANKER), order_of),
        Peer(NAIVE, naive, naive_env, "/rerank", rerank_body(None), order_of),
    ]
    python = FASTEMBED_VENV / "bin" / "python"
    if python.exists():
        env = {"FASTEMBED_MODEL_PATH": str(row.model), "FASTEMBED_TOKENIZER": str(row.tokenizer)}
        env |= {"FASTEMBED_MAX_LENGTH": str(row.max_length), "HF_HUB_OFFLINE": "1"}
        command = [str(python), "-m", "uvicorn", *workers, "tests.bench.peers.fastembed_rerank_server:app"]
        found.append(Peer("fastembed TextCrossEncoder", command, env, "/rerank", rerank_body(None), order_of))
    return found


@contextmanager
def serving(peer: Peer, port: int, body: bytes) -> Iterator[subprocess.Popen[bytes]]:
    """``peer`` started on ``port``, once it answers ``body``."""
    env = {**os.environ, **peer.env}
    proc = subprocess.Popen(
        [*peer.command, "--port", str(port)],
        env=env,
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{peer.label} exited with {proc.returncode}")
            try:
                if httpx.post(f"http://127.0.0.1:{port}{peer.path}", content=body, timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{peer.label} did not answer")
            time.sleep(0.2)  # polling a starting server: nothing to wait on but its port
        yield proc
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # a worker still in a long run: nothing left to keep
            os.killpg(proc.pid, 9)
            proc.wait(30)


def idle(pids: list[int]) -> None:
    """Once the processes have stopped computing: under a tenth of a core over a quarter of a second."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        before, began = sum(cpu_seconds(pid) for pid in pids), time.monotonic()
        time.sleep(0.25)  # the window the CPU is measured over
        if sum(cpu_seconds(pid) for pid in pids) - before < 0.1 * (time.monotonic() - began):
            return
    raise RuntimeError("the server kept computing two minutes after its load stopped")


def load(proc: subprocess.Popen[bytes], url: str, bodies: Sequence[bytes], pairs: float) -> tuple[Run, int]:
    """The server under wrk: its run per pair (``pairs``: a request's on average), and the requests that failed."""
    run_wrk(url, bodies, connections=CONNECTIONS, seconds=2)  # warm-up, discarded
    pids = process_tree(proc.pid)
    idle(pids)  # what the warm-up left queued would count against the run that follows
    before = sum(cpu_seconds(pid) for pid in pids)
    found = run_wrk(url, bodies, connections=CONNECTIONS, seconds=SECONDS)
    used = sum(cpu_seconds(pid) for pid in pids) - before
    answered = (found.requests - found.errors) * pairs
    if not answered:
        raise RuntimeError(f"{url}: wrk got no answer in {SECONDS:g} s ({found.errors} failed)")
    return Run(answered / found.seconds, used / answered * 1e3, found.p50, found.p99), found.errors


def main() -> None:
    cpus = available_cpus()
    served = manifest()
    rows = workloads(served)
    held = max(1, CONNECTIONS // cpus)  # the requests one process of a server holds at 16 connections
    raw: dict[str, dict[str, list[float]]] = {}
    runs: dict[tuple[str, str], list[Run]] = {}
    errors: dict[tuple[str, str], int] = {}
    port = 18431
    for _ in range(ROUNDS):
        for row in rows:
            for name, ms in floors(row, held, cpus).items():
                raw.setdefault(row.name, {}).setdefault(name, []).append(ms)
            checked = row.requests[::8]
            reference: list[list[Any]] | None = None
            for peer in peers(row, served, cpus):
                with serving(peer, port, peer.body(row.requests[0])) as proc:
                    url = f"http://127.0.0.1:{port}{peer.path}"
                    got = [peer.ranks(httpx.post(url, content=peer.body(r), timeout=60).json()) for r in checked]
                    reference = reference or got
                    # Scores to 3 places (float32 sums in another order, by another padding, move the last digits).
                    agreeing = np.mean([a == b for a, b in zip(got, reference, strict=True)])
                    if agreeing < 0.9:
                        raise AssertionError(f"{peer.label}: {agreeing:.0%} of the answers agree with fnserve's")
                    bodies = [peer.body(r) for r in row.requests]
                    run, failed = load(proc, url, bodies, row.pairs / len(row.requests))
                    runs.setdefault((row.name, peer.label), []).append(run)
                    errors[(row.name, peer.label)] = errors.get((row.name, peer.label), 0) + failed
                port += 1
    report(cpus, held, rows, raw, runs, errors)


def report(
    cpus: int,
    held: int,
    rows: list[Workload],
    raw: dict[str, dict[str, list[float]]],
    runs: dict[tuple[str, str], list[Run]],
    errors: dict[tuple[str, str], int],
) -> None:
    for row in rows:
        floor = raw[row.name]
        best = [min(values[i] for values in floor.values()) for i in range(ROUNDS)]
        what = (
            f"{len(row.requests)} requests of a query and 16 to 64 documents ({row.pairs} pairs)"
            if row.name == RERANKER
            else f"{len(row.requests)} texts, one a request"
        )
        print(f"\n{row.name} ({row.model.parent.parent.name}), {what}, {cpus} CPUs, {ROUNDS} interleaved rounds:")
        print(f"  median (range); the floor: raw onnxruntime, {cpus} processes x 1 thread, CPU per pair, the pairs of")
        print(f"  {held} requests drawn at random (what a process of a server holds at {CONNECTIONS}), by each cut:")
        for name in floor:
            print(f"    {name:<32} {shown(floor[name], '.3f')} ms")
        print(f"    {'best':<32} {shown(best, '.3f')} ms")
        print(f"  wrk -t1 -c{CONNECTIONS}, {SECONDS:g} s:")
        first = None
        for (name, label), served in runs.items():
            if name != row.name:
                continue
            cpu = [r.cpu_ms for r in served]
            first = first or cpu
            over = shown([cpu[i] / best[i] for i in range(ROUNDS)], ".2f")
            versus = shown([cpu[i] / first[i] for i in range(ROUNDS)], ".2f")
            print(
                f"    {label:<30} {shown([r.rate for r in served], '.0f')} pairs/s  CPU {shown(cpu, '.3f')} ms/pair"
                f"  {over}x the floor  {versus}x fnserve's CPU"
                f"  p50 {shown([r.p50 for r in served], '.1f')}  p99 {shown([r.p99 for r in served], '.1f')} ms"
                f"  failed {errors[(name, label)]}"
            )
    if not (FASTEMBED_VENV / "bin" / "python").exists():
        print("  fastembed not run: make .venv-fastembed/.installed (make bench-peers makes it)")
    print("  fastembed has no text classifier; the classify row has no fastembed peer")


if __name__ == "__main__":
    main()
