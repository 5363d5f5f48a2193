"""This checkout's ``fnserve serve`` against another checkout's, in one run: the figures a refactoring must keep.

    python -m tests.bench.bench_ab /path/to/other/checkout [MODEL ...]    (e.g. a git worktree of main; needs wrk)

The other checkout runs with this virtualenv, its own package first on ``PYTHONPATH``, so the two differ only in
fnserve's code. On the demo manifest, as shipped, under wrk at 16 connections: ``digits-accurate`` (batch 1 JSON,
the HTTP benchmark's load), ``minilm-l6`` (16 tokens a row, adaptively batched) and ``minilm-embed`` (text, the
batching benchmark's sentences), or only the models named. ``BENCH_AB_ROUNDS`` interleaved rounds (3) of
``BENCH_BATCHING_SECONDS`` (10) after a 2 s warm-up, the two checkouts alternating within each round so that drift
hits both alike; each figure is the median over the rounds, with the range, and the server's CPU per request (its
processes' CPU time over the requests answered) beside requests a second, since wrk shares the cores.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

from tests.bench._digits import BODY
from tests.bench._minilm import sentences, tensor_body, text_body
from tests.bench._servers import Server, load, serving
from tests.helpers import DEMO_MANIFEST, REPO

ROUNDS = int(os.environ.get("BENCH_AB_ROUNDS", "3"))
PORT = 18091


def main() -> None:
    other = Path(sys.argv[1]).resolve()
    if not (other / "layers" / "fnserve" / "fnserve").is_dir():
        raise SystemExit(f"{other} is not an fnserve checkout (no layers/fnserve/fnserve)")
    command = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST)]
    trees = {"this": REPO, "other": other}
    loads = {
        "digits-accurate, JSON": ("digits-accurate", [BODY.encode()]),
        "minilm-l6, tensors": ("minilm-l6", [tensor_body()]),
        "minilm-embed, text": ("minilm-embed", [text_body(t) for t in sentences()]),
    }
    if sys.argv[2:]:
        loads = {what: load for what, load in loads.items() if load[0] in sys.argv[2:]}
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {(w, t): [] for w in loads for t in trees}
    for _ in range(ROUNDS):
        for what, (model, bodies) in loads.items():
            for tree, root in trees.items():
                env = {"PYTHONPATH": f"{root / 'layers' / 'fnserve'}{os.pathsep}{root}"}
                server = Server(f"{tree}: {what}", command, env, model, what.endswith("text"))
                with serving(server, PORT, bodies[0]) as proc:
                    found = load(proc, f"http://127.0.0.1:{PORT}/v2/models/{model}/infer", bodies, 16)
                runs[(what, tree)].append((found.rate, found.cpu_ms))
    print(f"fnserve serve, this checkout ({REPO}) against {other}: wrk c16, {ROUNDS} interleaved rounds, medians")
    print(f"    {'':<26}{'':<7}{'req/s':>8}  {'range':>13}  {'CPU ms/req':>10}  {'range':>15}  {'this/other':>10}")
    for what in loads:
        rates = {t: sorted(r[0] for r in runs[(what, t)]) for t in trees}
        cpus = {t: sorted(r[1] for r in runs[(what, t)]) for t in trees}
        for tree in trees:
            rate, cpu = statistics.median(rates[tree]), statistics.median(cpus[tree])
            ratio = rate / statistics.median(rates["other"])
            print(
                f"    {what:<26}{tree:<7}{rate:8.0f}  {rates[tree][0]:6.0f}-{rates[tree][-1]:<6.0f}  {cpu:10.3f}  "
                f"{cpus[tree][0]:7.3f}-{cpus[tree][-1]:<7.3f}  {ratio:9.3f}x"
            )


if __name__ == "__main__":
    main()
