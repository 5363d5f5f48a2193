"""InferenceService overhead over raw onnxruntime, and cold-start cost.

    make bench        (or: python -m tests.bench.bench_service)

Every figure is a ratio against a baseline measured in the same run: raw
``session.run`` is the floor for per-call cost; a bare script that imports
onnxruntime + numpy, creates the session and runs once is the floor for cold start.
"""

from __future__ import annotations

import os
import statistics

import numpy as np

from fnserve.core.execution.service import InferenceService
from tests.bench._timing import fresh_process_seconds, interleaved, median_us
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3000"))
COLD_RUNS = int(os.environ.get("BENCH_COLD_RUNS", "15"))


def overhead() -> None:
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    pixels = np.load(DEMO_HOLDOUT)["input"]
    print(f"service overhead over raw session.run ({ROUNDS} interleaved rounds, medians)")
    print(f"{'model':<22}{'batch':>6}{'raw µs':>10}{'service µs':>12}{'overhead µs':>13}{'ratio':>8}")
    for name in ("digits-fast", "digits-accurate", "digits-accurate-int8"):
        session = service.registry.get(name).session
        for batch in (1, 64):
            x = np.ascontiguousarray(pixels[:batch])
            raw, svc = interleaved(
                [
                    lambda s=session, x=x: s.run(None, {"input": x}),
                    lambda n=name, x=x: service.predict(n, {"input": x}),
                ],
                ROUNDS,
            )
            r, s = median_us(raw), median_us(svc)
            print(f"{name:<22}{batch:>6}{r:>10.1f}{s:>12.1f}{s - r:>13.1f}{s / r:>8.2f}x")


FLOOR = """
import numpy as np, onnxruntime as ort
s = ort.InferenceSession({path!r}, providers=["CPUExecutionProvider"])
s.run(None, {{"input": np.zeros((1, 64), np.float32)}})
"""

FNSERVE = """
import numpy as np
from fnserve import InferenceService
svc = InferenceService.from_manifest({manifest!r})
svc.predict("digits-accurate", {{"input": np.zeros((1, 64), np.float32)}})
"""

IMPORT_ONLY = "import fnserve"


def cold_start() -> None:
    path = str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx")
    scripts = {
        "floor: bare onnxruntime script": FLOOR.format(path=path),
        "fnserve: import + first predict": FNSERVE.format(manifest=str(DEMO_MANIFEST)),
        "python -c 'import fnserve'": IMPORT_ONLY,
        "python -c 'pass'": "pass",
    }
    times: dict[str, list[float]] = {k: [] for k in scripts}
    for _ in range(COLD_RUNS):  # interleaved so that disk cache and CPU noise hit all alike
        for label, code in scripts.items():
            times[label].append(fresh_process_seconds(code))
    floor = statistics.median(times["floor: bare onnxruntime script"])
    print(f"\ncold start: fresh process, median of {COLD_RUNS} interleaved runs")
    for label, samples in times.items():
        med = statistics.median(samples)
        print(f"  {label:<36}{med * 1e3:8.1f} ms  {med / floor:5.2f}x floor")


if __name__ == "__main__":
    overhead()
    cold_start()
