"""``fnserve bench --targets``' chart, opened in a real headless Chromium: its screenshot shows one line per target
family in the plot, each in its own colour; and the command end to end on the digits model, where a budget no target
can meet is answered in a sentence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fnserve.bench import chart, cost, sizing, targets
from fnserve.bench.targets import Choices, Measured, Profile
from fnserve.cli import app
from tests.helpers import DEMO_MANIFEST

pytestmark = pytest.mark.slow
BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # Debian's package is chromium (make test-servers)
NEAR = 16  # how far, per channel, a pixel may be from a line's colour (its antialiased edges are farther)
LINE_PIXELS = 200  # a line across the plot is thousands of pixels; a legend swatch is outside the plot


def browser() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    pytest.skip(f"no headless browser ({', '.join(BROWSERS)}) on PATH: apt-get install chromium (make test-servers)")


def screenshot(page: Path, out: Path) -> Image.Image:
    command = [
        browser(),
        "--headless",
        "--no-sandbox",  # as root, as in CI's containers
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={out.parent / 'chromium-profile'}",
        f"--window-size={chart.WIDTH},{chart.HEIGHT}",
        f"--screenshot={out}",
        page.as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return Image.open(out).convert("RGB")


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def pixels_near(image: Image.Image, colour: str) -> int:
    distance = np.abs(np.asarray(image, dtype=np.int16) - np.array(rgb(colour), dtype=np.int16))
    return int((distance <= NEAR).all(axis=-1).sum())


def test_the_html_chart_shows_one_line_per_target_in_a_real_browser(tmp_path: Path) -> None:
    measured = Measured(cpu_ms=0.5, p99_ms=2.0, start_ms=150.0, memory_mb=120.0)
    at = Profile(rps=1.0, peak_rps=4.0, bytes_in=1300, bytes_out=320, p99_ms=None)
    drawn = cost.drawing(measured, at, Choices(), cost.grid(at), "digits")
    written = chart.write(drawn, tmp_path, below="the table")
    assert [p.name for p in written] == [chart.PNG_FILE, chart.HTML_FILE]
    assert (tmp_path / chart.PNG_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / chart.HTML_FILE).read_text()
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")

    image = screenshot(tmp_path / chart.HTML_FILE, tmp_path / "shot.png")
    assert image.size == (chart.WIDTH, chart.HEIGHT)
    plot = image.crop((chart.LEFT + 2, chart.TOP + 2, chart.RIGHT - 2, chart.BOTTOM - 2))  # the legend is outside
    assert [c.name for c in drawn.curves] == list(targets.FAMILIES)
    for curve in drawn.curves:
        assert pixels_near(plot, curve.colour) > LINE_PIXELS, f"no line for {curve.name} ({curve.colour})"
    unused = next(c for c in chart.PALETTE if c not in {curve.colour for curve in drawn.curves})
    assert pixels_near(plot, unused) == 0  # the check tells colours apart


def test_targets_end_to_end_and_a_budget_no_target_meets(tmp_path: Path) -> None:
    options = ["--targets", "--rps", "5", "--lambda-seconds", "0.3", "--out", str(tmp_path), "--front-door", "api"]
    result = CliRunner().invoke(
        app, ["bench", str(DEMO_MANIFEST), "--model", "digits-accurate", *options, "--p99-ms", "0.0001"]
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    cgroup = sizing.make_cgroup(f"fnserve-test-{os.getpid()}")
    if isinstance(cgroup, str):
        assert "no target can be costed without a request's time at one vCPU" in result.output
        return
    cgroup.remove()
    assert "no target meets p99 <= 0.0001 ms at 5 req/s mean" in result.output
    assert "Traceback" not in result.output
    found = json.loads((tmp_path / cost.JSON_FILE).read_text())
    assert found["recommended"] is None and found["profile"]["rps"] == 5
    assert found["profile"]["bytes_in"] > 0 and found["profile"]["bytes_out"] > 0  # the request's and its answer's
    assert len(found["rows"]) == len(targets.rows(Measured(**found["measured"]), Profile(**found["profile"])))
    assert {p.name for p in tmp_path.iterdir()} >= {cost.TABLE_FILE, chart.PNG_FILE, chart.HTML_FILE}
    doors = {row["door"] for row in found["rows"]}
    assert doors == {"HTTP API", "REST API", "Google API Gateway", "HTTP API + ALB"}, doors
    assert "front door: a managed API before each" in (tmp_path / cost.TABLE_FILE).read_text()


def test_a_front_door_the_bench_does_not_know_is_refused_before_anything_runs() -> None:
    result = CliRunner().invoke(app, ["bench", str(DEMO_MANIFEST), "--targets", "--front-door", "alb"])
    assert result.exit_code != 0 and "--front-door takes one of own, api, not 'alb'" in result.output
