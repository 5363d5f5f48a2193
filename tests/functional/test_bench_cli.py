"""``fnserve bench`` on the digits model, for real and tiny: a sweep of real servers under load, its
recommendation and files; the profile; the Lambda sizes; and ``fnserve serve --cpu-affinity``'s pinning."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fnserve.bench import sizing, sweep
from fnserve.cli import app
from fnserve.core.host import available_cpus, slot_cpus
from tests.helpers import DEMO_MANIFEST
from tests.servers import start_server, wait_for

pytestmark = pytest.mark.slow
runner = CliRunner()
QUICK = ["--seconds", "0.4", "--max-concurrency", "2", "--floor-seconds", "0.02", "--generator", "built-in"]


def bench(*options: str) -> str:
    result = runner.invoke(app, ["bench", str(DEMO_MANIFEST), "--model", "digits-accurate", *options])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_a_tiny_sweep_recommends_its_fastest_configuration_and_writes_every_file(tmp_path: Path) -> None:
    output = bench("--stages", "layout", "--confirm-seconds", "0.4", "--p99-ms", "1000", "--out", str(tmp_path), *QUICK)
    found = json.loads((tmp_path / "bench.json").read_text())
    results = found["results"]
    assert [r["label"] for r in results] == [c.label() for c in sweep.layouts(available_cpus())]
    for result in results:
        assert result["error"] is None and result["points"], result
        assert [p["concurrency"] for p in result["points"]] == [1, 2]
        assert all(p["rate"] > 0 and p["errors"] == 0 and p["cpu_ms"] > 0 for p in result["points"])
    best = max(results, key=lambda r: max(p["rate"] for p in r["points"]))
    assert found["recommended"] == best["label"]
    assert (
        found["confirmed"]["rate"] > 0
        and found["confirmed"]["concurrency"] == found["recommended_point"]["concurrency"]
    )
    assert found["floor"]["capacity"] > 0 and {p["batch"] for p in found["floor"]["points"]} >= {1, 2, 4, 64}
    row = next(r for r in found["table"] if r["config"] == best["label"])
    assert row["floor_ratio"] == pytest.approx(row["rate"] / found["floor"]["capacity"])

    config = sweep.Config(**best["config"])
    snippet = (tmp_path / "recommended.txt").read_text()
    assert snippet.startswith(config.snippet(DEMO_MANIFEST, "digits-accurate", "digits-accurate").splitlines()[0])
    for png in ("throughput.png", "latency.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "recommended (*, most throughput within the p99 budget)" in output
    assert re.search(r"confirmed by a fresh server, built-in, \d+ connections", output)


def test_the_profile_writes_a_speedscope_file_and_the_stage_split(tmp_path: Path) -> None:
    output = bench("--no-sweep", "--profile", "--profile-seconds", "1", "--out", str(tmp_path), *QUICK)
    assert re.search(r"^\s+infer\s+[\d.]+ ms\s+[\d.]+%$", output, re.MULTILINE), output
    assert re.search(r"^\s+decode\s+[\d.]+ ms", output, re.MULTILINE)
    profile = tmp_path / "profile.speedscope.json"
    if "no flame graph: py-spy could not sample" in output:
        pytest.skip(f"py-spy cannot attach to processes on this machine: {output.splitlines()[-1]}")
    speedscope = json.loads(profile.read_text())
    assert speedscope["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = [f["name"] for f in speedscope["shared"]["frames"]]
    assert speedscope["profiles"] and any("run" in name for name in frames)  # onnxruntime's run, sampled


def test_lambda_sizes_are_measured_under_cpu_quotas_or_it_says_why_not(tmp_path: Path) -> None:
    output = bench("--no-sweep", "--lambda", "--memory", "512,1769", "--lambda-seconds", "0.5", "--out", str(tmp_path))
    cgroup = sizing.make_cgroup(f"fnserve-test-{os.getpid()}")
    if isinstance(cgroup, str):
        assert "no CPU quota can be applied here" in output
        return
    cgroup.remove()
    sizes = json.loads((tmp_path / "lambda.json").read_text())
    assert [s["memory_mb"] for s in sizes] == [512, 1769]
    small, full = sizes
    assert small["emulated_cpus"] == pytest.approx(512 / 1769) and full["emulated_cpus"] == 1.0
    measured = [(s["memory_mb"], s["invocations"], s["p50"], s["peak_mb"], s["fits"]) for s in sizes]
    assert all(s["invocations"] >= 20 and s["p50"] > 0 and s["peak_mb"] > 50 and s["fits"] for s in sizes), measured
    assert small["init_ms"] > full["init_ms"]  # the same init on a third of a CPU takes longer
    assert small["cost_per_million"] == pytest.approx(0.2 + 1e6 * small["billed_ms"] / 1e3 * 0.5 * 0.0000166667)
    assert "cheapest (*): MemorySize:" in output


def test_bench_refuses_what_it_cannot_run() -> None:
    result = runner.invoke(app, ["bench", str(DEMO_MANIFEST), "--model", "digits"])
    assert result.exit_code == 1 and "is a cascade" in result.output
    result = runner.invoke(app, ["bench", str(DEMO_MANIFEST), "--model", "digits-fast", "--stages", "warp"])
    assert result.exit_code == 1 and "unknown --stages ['warp']" in result.output
    result = runner.invoke(app, ["bench", str(DEMO_MANIFEST), "--lambda", "--memory", "64"])
    assert result.exit_code == 1 and "128 to 10240 MB" in result.output


def test_serve_pins_each_inference_worker_to_its_own_cpus(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    log = tmp_path / "serve.log"
    proc, _ = start_server(["-m", str(DEMO_MANIFEST), "--workers", "2", "--cpu-affinity"], log)
    try:
        wait_for(lambda: log.read_text().count("pinned to CPUs") == 2, 30, "both workers to pin themselves")
        pinned = re.findall(r"inference process (\d+) pinned to CPUs \[([\d, ]*)\] \(slot (\d) of 2\)", log.read_text())
        assert sorted(int(slot) for _, _, slot in pinned) == [0, 1]
        for pid, listed, slot in pinned:
            expected = slot_cpus(cpus, 2, int(slot))
            assert [int(c) for c in listed.split(",")] == expected
            assert sorted(os.sched_getaffinity(int(pid))) == expected  # every thread of it, ORT's included
            for task in Path(f"/proc/{pid}/task").iterdir():
                assert sorted(os.sched_getaffinity(int(task.name))) == expected
        assert sorted(os.sched_getaffinity(proc.pid)) == cpus  # the front process is not pinned
    finally:
        proc.terminate()
        proc.wait(timeout=30)
