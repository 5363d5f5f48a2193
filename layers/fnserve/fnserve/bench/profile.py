"""``fnserve bench --profile``: where a server's time goes under load, before anything is optimised.

The server of one configuration runs under closed-loop load while py-spy samples every one of its
processes (the front processes and the inference workers, native frames included) and writes a
speedscope file (open it at https://www.speedscope.app or with ``speedscope FILE``). The same
load collects every answer's ``Server-Timing`` stages (decode, queue, pre, infer, post, encode),
whose mean split says which stage to look at first.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fnserve.bench.requests import Request
from fnserve.bench.sweep import Config, LoadOptions, Point, measure_point, serving
from fnserve.core.extras import missing

SPEEDSCOPE_FILE = "profile.speedscope.json"


@dataclass
class Profile:
    config: Config
    point: Point
    speedscope: Path | None = None
    missing: str | None = None  # why there is no flame graph
    stages: dict[str, float] = field(default_factory=dict)

    def split(self) -> list[tuple[str, float, float]]:
        """(stage, mean ms, share of the stages' total), largest first."""
        total = sum(self.stages.values()) or 1.0
        return sorted(((k, v, v / total) for k, v in self.stages.items()), key=lambda s: -s[1])


def py_spy() -> str | None:
    """py-spy's executable: on PATH, or beside this interpreter (a virtualenv not activated)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def profile(
    manifest: Path,
    target: str,
    config: Config,
    requests: Sequence[Request],
    *,
    concurrency: int,
    seconds: float,
    out: Path,
    rate: int = 200,
) -> Profile:
    """Load ``config``'s server at ``concurrency`` for ``seconds`` under py-spy; the stage split from the
    same load's Server-Timing headers."""
    out.mkdir(parents=True, exist_ok=True)
    spy = py_spy()
    with tempfile.TemporaryDirectory(prefix="fnserve-profile-") as tmp:
        with serving(manifest, target, config, requests[0], directory=Path(tmp)) as server:
            options = LoadOptions(seconds=seconds, generator="built-in", timings=True)
            measure_point(server, target, requests, concurrency, LoadOptions(seconds=1.0, generator="built-in"))
            if spy is None:
                point = measure_point(server, target, requests, concurrency, options)
                return Profile(config, point, None, missing("py_spy"), point.stages)
            target_file = out / SPEEDSCOPE_FILE
            command = [spy, "record", "--pid", str(server.process.pid), "--subprocesses", "--nonblocking"]
            command += ["--rate", str(rate), "--format", "speedscope", "--output", str(target_file)]
            command += ["--duration", str(max(1, round(seconds)))]
            spying = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            said = _attached(spying)  # the load starts once py-spy samples
            point = measure_point(server, target, requests, concurrency, options)
            rest, _ = spying.communicate(timeout=seconds + 60)
            said += rest
    if spying.returncode != 0 or not target_file.exists():
        why = said.strip().splitlines()[-1] if said.strip() else f"exit status {spying.returncode}"
        return Profile(config, point, None, f"py-spy could not sample the server: {why}", point.stages)
    return Profile(config, point, target_file, None, point.stages)


def _attached(spying: subprocess.Popen[str]) -> str:
    """What py-spy printed up to its "Sampling process ..." line (or its exit, when it cannot attach)."""
    assert spying.stdout is not None
    said = ""
    for line in spying.stdout:
        said += line
        if "Sampling" in line:
            break
    return said
