"""What a text model's token budget costs in memory, and onnxruntime's memory settings for it.

    python -m tests.bench.bench_memory [model.onnx max_batch_tokens max_batch_attention]   # the demo MiniLM's

Each setting runs in a fresh process (RSS read from /proc): the model's session made, one run of one row, then
runs of every shape the budget holds at the lengths 16 ... 256 (rows = the most the budget takes at that length),
then ``BURST`` rows of 256 tokens padded into one run (what a server without the cut did with a request), then the
budget's shapes again. Printed for each: RSS after the session, its rise over the budget's runs (what the budget
costs), its peak over the burst, RSS after it, and the milliseconds of the budget's runs (their median); then what
one text of 256 tokens takes at one thread and at two, what a batch of jobs is sized by. The
settings: onnxruntime's defaults (the CPU arena, memory patterns on), the arena off, memory patterns off, and the
arena with ``memory.enable_memory_arena_shrinkage`` asked for after each run past a threshold.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import DEMO_MANIFEST

MODEL = DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx"
TOKENS, ATTENTION = 1024, 32768  # the demo manifest's budget
BURST = 64
SETTINGS = ("defaults", "no arena", "no memory patterns", "arena shrunk after big runs")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(setting: str, model: str, tokens: int, attention: int) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if setting == "no arena":
        options.enable_cpu_mem_arena = False
    if setting == "no memory patterns":
        options.enable_mem_pattern = False
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    shrink = ort.RunOptions()
    shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(rows: int, length: int) -> float:
        feed = {name: np.ones((rows, length), np.int64) for name in names}
        started = time.perf_counter()
        big = rows * length > tokens
        session.run(None, feed, shrink if setting == "arena shrunk after big runs" and big else None)
        return (time.perf_counter() - started) * 1e3

    run(1, 8)
    after_session = rss_mb()
    shapes = [(max(1, min(tokens // n, attention // (n * n))), n) for n in (16, 32, 64, 128, 256)]
    times = [run(rows, n) for rows, n in shapes for _ in range(3)]
    budget = rss_mb()
    Path("/proc/self/clear_refs").write_text("5")
    run(BURST, 256)
    burst_peak = hwm_mb()
    after_burst = rss_mb()
    times += [run(rows, n) for rows, n in shapes for _ in range(3)]
    return {
        "session": after_session,
        "budget_rise": budget - after_session,
        "burst_peak_rise": burst_peak - after_session,
        "after_burst_rise": after_burst - after_session,
        "after_again_rise": rss_mb() - after_session,
        "budget_run_ms": statistics.median(times),
    }


def text_ms(model: str, threads: int, length: int = 256, seconds: float = 3.0) -> float:
    """Milliseconds one text of ``length`` tokens takes the model alone at ``threads`` (a batch of jobs' unit)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {i.name: np.ones((1, length), np.int64) for i in session.get_inputs()}
    session.run(None, feed)
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, feed)
        runs += 1
    return (time.perf_counter() - started) / runs * 1e3


def main() -> None:
    model, tokens, attention = (
        (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
        if len(sys.argv) > 3
        else (
            str(MODEL),
            TOKENS,
            ATTENTION,
        )
    )
    print(f"{model}: budget {tokens} tokens, {attention} attention; burst {BURST} x 256 tokens in one run")
    for setting in SETTINGS:
        code = (
            "import json, sys; from tests.bench.bench_memory import child; "
            f"print(json.dumps(child({setting!r}, {model!r}, {tokens}, {attention})))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{setting:28s} session {r['session']:6.0f} MB | budget's runs +{r['budget_rise']:5.1f} MB, "
            f"{r['budget_run_ms']:6.1f} ms median | burst peak +{r['burst_peak_rise']:6.0f} MB, "
            f"after it +{r['after_burst_rise']:6.0f} MB, after the budget's runs again +{r['after_again_rise']:6.0f} MB"
        )
    one, two = text_ms(model, 1), text_ms(model, 2)
    print(f"one text of 256 tokens: {one:.0f} ms at one thread, {two:.0f} ms at two (a batch of jobs sizes by it)")


if __name__ == "__main__":
    main()
