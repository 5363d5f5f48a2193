"""Text embeddings beside their peers: fnserve through OpenAI's embeddings API and through V2, the naive FastAPI
server, fastembed in a FastAPI server, and raw onnxruntime at its best batching, on the same texts and int8 model.

    make bench-peers    (or: python -m tests.bench.bench_embeddings, once make bench-peers has made
                         .venv-fastembed from tests/bench/peers/fastembed.txt; needs wrk)
    python -m tests.bench.bench_embeddings lengths    # CPU a text by length and batch size: why the budget

- **The texts**: a retrieval workload's mix, from the demo's sentences (``tests/data/sentences.txt``): each sentence
  as a query (3 to 64 tokens), and passages of consecutive sentences joined up to 48, 96, 160 or 256 tokens, one
  text in two of each kind. The model takes 256 tokens; the rare longer one is cut.
- **The floor**: raw onnxruntime (tokenize, run, mean-pool, as the naive server does), one single-threaded session
  per CPU, the texts cut into runs by each rule of ``CUTS`` (sorted by length; one a run, or within a budget of
  padded tokens, or of tokens and attention; 64 rows at most, ``MIN_FILL`` of the padded tokens real), every rule's
  runs of the same texts side by side in one process, each timed on its thread: over the whole mix sorted (the
  best of them the floor), and over 16 / CPUs texts drawn at random, what each process of a server at 16
  connections holds (the floor of any such server).
- **Servers under wrk** (one thread, ``CONNECTIONS`` connections, ``BENCH_EMBEDDINGS_SECONDS`` after a 2 s
  warm-up), one text a request: ``fnserve serve`` on the demo manifest as shipped, through ``POST /v1/embeddings``
  and through V2; the naive FastAPI + tokenizers + onnxruntime server (``plain_embed_server``) and fastembed
  serving the same int8 file from FastAPI (``peers/fastembed_server.py``), each a uvicorn worker per CPU of one
  ORT thread. Before any timing each server's embeddings of every eighth text are checked against fnserve's V2
  answer (cosine >= ``AGREE``). CPU per text is the CPU time of the server's processes over the texts answered;
  ``efficiency`` is the floor's CPU per text over it (and the drawn floor's, at 16); ``x fnserve`` a peer's over
  fnserve's (/v1).
- **Corpus**: ``BENCH_EMBEDDINGS_CORPUS`` texts (the mix, cycled, each made its own) as one SQS event of one-text
  jobs through fnserve's batch handler (binary bodies, as ``fnserve submit`` sends; results to memory), against
  fastembed's own ``embed`` of the same texts in one process: texts per CPU-second, each with every core.

Infinity (``infinity-emb``) is not run: see ``INFINITY`` for why. ``BENCH_EMBEDDINGS_ROUNDS`` interleaved rounds
(3); each figure is the median, with the range over the rounds.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from fnserve.bench.load import run_wrk
from fnserve.bench.sweep import process_tree
from fnserve.core.execution.embeddings import MIN_FILL, TokenBudget, token_runs
from fnserve.core.host import available_cpus
from tests.bench._minilm import MODEL, TOKENIZER, mix, text_body
from tests.bench._raw import each_side_by_side
from tests.bench._servers import Run, Server, serving
from tests.bench._timing import cpu_seconds, shown
from tests.helpers import DEMO_MANIFEST, REPO

ROUNDS = int(os.environ.get("BENCH_EMBEDDINGS_ROUNDS", "3"))
SECONDS = float(os.environ.get("BENCH_EMBEDDINGS_SECONDS", "10"))
RAW_SECONDS = float(os.environ.get("BENCH_EMBEDDINGS_RAW_SECONDS", "4"))
CORPUS = int(os.environ.get("BENCH_EMBEDDINGS_CORPUS", "10000"))
CONNECTIONS = (16, 64)
MAX_ROWS = 64
AGREE = 0.999  # int8 scales its activations by the batch: a text alone agrees closely, not exactly
FASTEMBED_VENV = REPO / ".venv-fastembed"
FNSERVE_V1 = "fnserve /v1/embeddings"
NAIVE = "naive FastAPI + tokenizers + ORT"
INFINITY = (
    "Infinity (infinity-emb) not run: its ONNX engine is optimum's ORTModel, which imports torch (from the package "
    "index a CUDA build, about 3 GB of wheels); it pins numpy<2 and older tokenizers than fnserve's; it reads the "
    "output last_hidden_state where this file names it token_embeddings (a renamed copy is another file); and it "
    "sets no onnxruntime thread count, so it cannot run one thread a worker as the others do."
)


def openai_body(text: str) -> bytes:
    return json.dumps({"model": "minilm-embed", "input": text}).encode()


# -- the floor ----------------------------------------------------------------------------------------

# How raw onnxruntime cuts its texts into runs: every text alone, by padded tokens (the longest times the rows), and
# by tokens and attention (the rows times the longest squared) as the demo's budget does. A run holds at most 64 rows,
# and at least MIN_FILL of its padded tokens are real.
CUTS: dict[str, TokenBudget | None] = {
    "batch 1": None,
    **{f"{tokens} tokens": TokenBudget(tokens=tokens) for tokens in (512, 1024, 2048, 4096)},
    "1024 tokens, 32768 attention": TokenBudget(tokens=1024, attention=32768),
    "4096 tokens, 32768 attention": TokenBudget(tokens=4096, attention=32768),
}
SLICE = 48  # the sorted corpus is run in slices of this many texts, every cut's runs of a slice side by side
DRAWS = 300


def single_threaded() -> tuple[Any, Any]:
    """The demo's tokenizer, and a session of the int8 model on one thread, as the naive server runs it."""
    import onnxruntime as ort

    from tests.bench._embed import tokenizer_from

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), sess_options=options, providers=["CPUExecutionProvider"])
    return tokenizer_from(str(TOKENIZER)), session


def cut(lengths: Sequence[int], texts: Sequence[int], budget: TokenBudget | None) -> list[list[int]]:
    """``texts`` (indices into ``lengths``) sorted by token length and cut where ``budget`` would no longer hold the
    run, where less than MIN_FILL of its padded tokens would be real, or at 64 rows (None: one a run)."""
    order = sorted(texts, key=lambda i: lengths[i])
    if budget is None:
        return [[i] for i in order]
    ends = token_runs([min(lengths[i], 256) for i in order], budget, MAX_ROWS)
    return [order[start:end] for start, end in itertools.pairwise([0, *ends])]


def _floors(held: int, seconds: float, start: Any, out: Any) -> None:
    """One single-threaded session running every cut's runs of the same texts in turn, its thread's CPU timed per
    cut, so that the machine's drift reaches every cut alike. ``held``: the texts a server's process holds at once,
    drawn at random (0: the whole corpus, sorted, in slices)."""
    import random

    from tests.bench._embed import embed

    tokenizer, session = single_threaded()
    texts = mix()
    lengths = [sum(e.attention_mask) for e in tokenizer.encode_batch(texts)]  # padded to the longest: count the mask
    if held:
        rng = random.Random()
        groups = [rng.sample(range(len(texts)), held) for _ in range(DRAWS)]
    else:
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        groups = [order[i : i + SLICE] for i in range(0, len(order), SLICE)]
    plans = {
        name: [[[texts[i] for i in run] for run in cut(lengths, g, b)] for g in groups] for name, b in CUTS.items()
    }
    for runs in plans.values():
        for run in runs[0]:
            embed(tokenizer, session, run)
    out.put(("ready", 0, 0.0))
    start.wait()
    rows = dict.fromkeys(CUTS, 0)
    used = dict.fromkeys(CUTS, 0.0)
    names = list(CUTS)
    deadline, done = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline or (not held and done % len(groups)):  # the corpus in whole passes
        random.shuffle(names)
        for name in names:
            began = time.thread_time()
            for run in plans[name][done % len(groups)]:
                embed(tokenizer, session, run)
                rows[name] += len(run)
            used[name] += time.thread_time() - began
        done += 1
    out.put(("done", rows, used))


def floors(held: int, processes: int) -> dict[str, float]:
    """CPU milliseconds per text of each cut, ``processes`` single-threaded sessions side by side."""
    results = each_side_by_side(functools.partial(_floors, held), processes, RAW_SECONDS * len(CUTS))
    return {name: sum(r[2][name] for r in results) / sum(r[1][name] for r in results) * 1e3 for name in CUTS}


def by_length(seconds: float = 20.0) -> None:
    """CPU a text of one single-threaded session at each length and batch size, every pair's runs taken in turn
    (``python -m tests.bench.bench_embeddings lengths``): where batching texts of one length gains, and where their
    attention outgrows the cache and it loses."""
    import random

    from tests.bench._embed import embed

    tokenizer, session = single_threaded()
    lengths, sizes = (16, 32, 64, 128, 256), (1, 2, 4, 8, 16)
    pairs = [(length, rows) for length in lengths for rows in sizes]
    texts = {length: " ".join(["word"] * (length - 2)) for length in lengths}  # [CLS], the words, [SEP]
    assert [len(tokenizer.encode(texts[n]).ids) for n in lengths] == list(lengths)
    used, ran = dict.fromkeys(pairs, 0.0), dict.fromkeys(pairs, 0)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        random.shuffle(pairs)
        for length, rows in pairs:
            began = time.thread_time()
            embed(tokenizer, session, [texts[length]] * rows)
            used[(length, rows)] += time.thread_time() - began
            ran[(length, rows)] += rows
    print(f"CPU ms a text, one thread, {seconds:g} s of runs taken in turn (rows x length^2 in brackets):")
    print("  tokens " + "".join(f"{f'batch {rows}':>22}" for rows in sizes))
    for length in lengths:
        cells = [f"{used[(length, r)] / ran[(length, r)] * 1e3:.2f} ({r * length * length:,})" for r in sizes]
        print(f"  {length:>6} " + "".join(f"{cell:>22}" for cell in cells))


# -- servers ------------------------------------------------------------------------------------------


def servers(cpus: int) -> list[Server]:
    fnserve = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST)]
    workers = ["--workers", str(cpus), "--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    workers += ["--log-level", "warning"]
    naive = {"PLAIN_MODEL_PATH": str(MODEL), "PLAIN_THREADS": "1", "PLAIN_TOKENIZER": str(TOKENIZER)}
    found = [
        Server(FNSERVE_V1, fnserve, {}, "minilm-embed", True),
        Server("fnserve V2", fnserve, {}, "minilm-embed", True),
        Server(
            NAIVE,
            [sys.executable, "-m", "uvicorn", *workers, "tests.bench.plain_embed_server:app"],
            naive,
            "minilm-embed",
            True,
        ),
    ]
    fastembed = FASTEMBED_VENV / "bin" / "python"
    if fastembed.exists():
        env = {"FASTEMBED_MODEL_PATH": str(MODEL), "FASTEMBED_TOKENIZER": str(TOKENIZER), "HF_HUB_OFFLINE": "1"}
        command = [str(fastembed), "-m", "uvicorn", *workers, "tests.bench.peers.fastembed_server:app"]
        found.append(Server("fastembed in FastAPI", command, env, "minilm-embed", True))
    return found


def embeddings_of(url: str, server: Server, texts: Sequence[str]) -> np.ndarray[Any, Any]:
    """Each text's embedding from a running server, one request each."""
    out = []
    for text in texts:
        if server.label == FNSERVE_V1:
            answer = httpx.post(f"{url}/v1/embeddings", content=openai_body(text), timeout=60)
            answer.raise_for_status()
            out.append(answer.json()["data"][0]["embedding"])
        else:
            answer = httpx.post(f"{url}/v2/models/minilm-embed/infer", content=text_body(text), timeout=60)
            answer.raise_for_status()
            out.append(answer.json()["outputs"][0]["data"])
    return np.asarray(out, dtype=np.float32)


def load(proc: subprocess.Popen[bytes], url: str, bodies: Sequence[bytes], connections: int) -> tuple[Run, int]:
    """The server under wrk: its run, and the requests wrk counted as failed (shown beside the figures: a rare socket
    error as wrk stops is no reason to throw a round away, and a refusal would show in the count)."""
    run_wrk(url, bodies, connections=connections, seconds=2)  # warm-up, discarded
    pids = process_tree(proc.pid)
    before = sum(cpu_seconds(pid) for pid in pids)
    found = run_wrk(url, bodies, connections=connections, seconds=SECONDS)
    used = sum(cpu_seconds(pid) for pid in pids) - before
    answered = found.requests - found.errors
    return Run(answered / found.seconds, used / answered * 1e3, found.p50, found.p99), found.errors


def agrees(got: np.ndarray[Any, Any], expected: np.ndarray[Any, Any], label: str) -> None:
    cosine = np.sum(got * expected, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    if cosine.min() < AGREE:
        raise AssertionError(f"{label}: embeddings disagree with fnserve's (cosine {cosine.min():.5f})")


# -- the corpus ---------------------------------------------------------------------------------------


def corpus() -> list[str]:
    texts = mix()
    return [f"{texts[i % len(texts)]} ({i})" for i in range(CORPUS)]


def fnserve_corpus() -> float:
    """Texts per CPU-second of fnserve's SQS batch handler on one event of one-text jobs."""
    from fnserve.adapters.lambda_.sqs import create_handler
    from fnserve.aws.events import LambdaContext, sqs_event
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.jobs.messages import job_message
    from fnserve.settings import Settings
    from tests.helpers import MemoryStore

    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    store = MemoryStore()
    handler = create_handler(service=service, settings=Settings(manifest=DEMO_MANIFEST), store=store)
    texts = corpus()
    bodies = [
        json.dumps(job_message(f"c-{i}", "minilm-embed", {"text": np.array([t.encode()], object)}, binary=True))
        for i, t in enumerate(texts)
    ]
    event = sqs_event(bodies)
    began = time.process_time()
    assert handler(event, LambdaContext()) == {"batchItemFailures": []}
    used = time.process_time() - began
    assert len(store.records) == len(texts)
    return len(texts) / used


FASTEMBED_CORPUS = """
import json, resource, sys
from tests.bench.peers.fastembed_server import model
texts = json.load(sys.stdin)
list(model.embed(texts[:64]))
before = resource.getrusage(resource.RUSAGE_SELF)
count = sum(1 for _ in model.embed(texts))
after = resource.getrusage(resource.RUSAGE_SELF)
used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(json.dumps({"texts": count, "cpu": used}))
"""


def fastembed_corpus() -> float | None:
    """Texts per CPU-second of fastembed's own ``embed`` over the corpus, in one process (None: not installed)."""
    python = FASTEMBED_VENV / "bin" / "python"
    if not python.exists():
        return None
    env = {**os.environ, "FASTEMBED_MODEL_PATH": str(MODEL), "FASTEMBED_TOKENIZER": str(TOKENIZER)}
    env |= {"HF_HUB_OFFLINE": "1", "FASTEMBED_THREADS": str(available_cpus())}  # every core, as fnserve's handler
    done = subprocess.run(
        [str(python), "-c", FASTEMBED_CORPUS],
        input=json.dumps(corpus()),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=1800,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["texts"]) / float(result["cpu"])


def main() -> None:
    cpus = available_cpus()
    texts = mix()
    port = 18331
    raw: dict[int, dict[str, list[float]]] = {0: {}, CONNECTIONS[0] // cpus: {}}
    runs: dict[tuple[str, int], list[Run]] = {}
    errors: dict[tuple[str, int], int] = {}
    corpus_rates: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for held, found in raw.items():
            for name, ms in floors(held, cpus).items():
                found.setdefault(name, []).append(ms)
        reference: np.ndarray[Any, Any] | None = None
        for server in servers(cpus):
            with serving(server, port, text_body(texts[0])) as proc:
                url = f"http://127.0.0.1:{port}"
                got = embeddings_of(url, server, texts[::8])
                if reference is None:
                    reference = got
                agrees(got, reference, server.label)
                path = "/v1/embeddings" if server.label == FNSERVE_V1 else "/v2/models/minilm-embed/infer"
                bodies = [openai_body(t) if server.label == FNSERVE_V1 else text_body(t) for t in texts]
                for connections in CONNECTIONS:
                    run, failed = load(proc, f"{url}{path}", bodies, connections)
                    runs.setdefault((server.label, connections), []).append(run)
                    errors[(server.label, connections)] = errors.get((server.label, connections), 0) + failed
            port += 1
        corpus_rates.setdefault("fnserve", []).append(fnserve_corpus())
        rate = fastembed_corpus()
        if rate is not None:
            corpus_rates.setdefault("fastembed", []).append(rate)
    report(cpus, texts, raw, runs, errors, corpus_rates)


def report(
    cpus: int,
    texts: Sequence[str],
    raw: dict[int, dict[str, list[float]]],
    runs: dict[tuple[str, int], list[Run]],
    errors: dict[tuple[str, int], int],
    corpus_rates: dict[str, list[float]],
) -> None:
    (_, whole), (held, drawn) = raw.items()
    best = [min(values[i] for values in whole.values()) for i in range(ROUNDS)]
    best_held = [min(values[i] for values in drawn.values()) for i in range(ROUNDS)]
    print(f"\nText embeddings, minilm-embed (all-MiniLM-L6-v2 int8), {len(texts)} texts (queries and passages of up")
    print(f"to 256 tokens), {cpus} CPUs, {ROUNDS} interleaved rounds: median (range)")
    print(f"  the floor: raw onnxruntime, {cpus} processes x 1 thread, CPU per text, runs cut by each rule (64 rows")
    print(f"  at most, {MIN_FILL:.0%} of their padded tokens real) side by side in one process:")
    print(f"    {'cut':<30} {'the texts sorted':<26} {held} drawn at random (a process's share of {CONNECTIONS[0]})")
    for name in whole:
        print(f"    {name:<30} {shown(whole[name], '.3f') + ' ms':<26} {shown(drawn[name], '.3f')} ms")
    print(f"    {'best':<30} {shown(best, '.3f') + ' ms':<26} {shown(best_held, '.3f')} ms")
    fnserve_cpu = {c: [run.cpu_ms for run in runs[(FNSERVE_V1, c)]] for c in CONNECTIONS}
    for connections in CONNECTIONS:
        print(f"  one text a request, wrk -t1 -c{connections}, {SECONDS:g} s:")
        for (label, c), served in runs.items():
            if c != connections:
                continue
            cpu = [run.cpu_ms for run in served]
            efficiency = shown([best[i] / cpu[i] for i in range(ROUNDS)], ".2f")
            if connections == CONNECTIONS[0]:  # against what the texts it holds allow, too
                efficiency += f" ({shown([best_held[i] / cpu[i] for i in range(ROUNDS)], '.2f')} of {held} drawn)"
            versus = shown([cpu[i] / fnserve_cpu[c][i] for i in range(ROUNDS)], ".2f")
            print(
                f"    {label:<34} {shown([r.rate for r in served], '.0f')} texts/s  CPU {shown(cpu, '.3f')} ms/text"
                f"  efficiency {efficiency}  {versus}x fnserve's CPU  p50 {shown([r.p50 for r in served], '.1f')}"
                f"  p99 {shown([r.p99 for r in served], '.1f')} ms  failed {errors[(label, c)]}"
            )
        if connections == CONNECTIONS[0]:
            naive = [run.cpu_ms for run in runs[(NAIVE, connections)]]
            bound = shown([naive[i] / best_held[i] for i in range(ROUNDS)], ".2f")
            print(f"    no server whose {cpus} processes share {connections} connections runs its texts under {held}")
            print(f"    drawn's best: the naive server's CPU over it, {bound}x, is the most any server can show")
    print(f"  {INFINITY}")
    print(f"  corpus: {CORPUS:,} texts, texts per CPU-second, every core:")
    for name, rates in corpus_rates.items():
        label = "fnserve SQS handler, one event" if name == "fnserve" else "fastembed embed(), in process"
        print(f"    {label:<34} {shown(rates, '.0f')}")
    if "fastembed" in corpus_rates:
        ratio = [corpus_rates["fnserve"][i] / corpus_rates["fastembed"][i] for i in range(ROUNDS)]
        print(f"    fnserve / fastembed              {shown(ratio, '.2f')}x")


if __name__ == "__main__":
    if sys.argv[1:] == ["lengths"]:
        by_length()
    else:
        main()
