"""``fnserve serve``'s log lines: JSON for what collects them (a pipe, a container's log driver), readable at a
terminal (FNSERVE_LOG_FORMAT=console, what ``auto`` picks there), in every one of its processes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx

from tests.helpers import DEMO_MANIFEST
from tests.servers import start_server

DIGIT = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


def serve_and_read(tmp_path: Path, log_format: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "FNSERVE_LOG_FORMAT"}
    if log_format is not None:
        env["FNSERVE_LOG_FORMAT"] = log_format
    log = tmp_path / f"serve-{log_format}.log"
    options = ["-m", str(DEMO_MANIFEST), "--processes", "2", "--workers", "0", "--access-log"]
    proc, url = start_server(options, log, env=env)
    try:
        assert httpx.post(f"{url}/v2/models/digits-accurate/infer", json=DIGIT).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return log.read_text().splitlines()


def test_at_a_terminal_lines_read_as_the_emulator_console_does(tmp_path: Path) -> None:
    lines = serve_and_read(tmp_path, "console")
    assert not [line for line in lines if line.startswith('{"level"')], lines[:5]
    loaded = [line for line in lines if "loaded model 'digits-accurate'" in line]
    assert len(loaded) >= 2  # each front process, rendered
    assert re.match(r"^\d\d:\d\d:\d\d INFO\s+loaded model 'digits-accurate'", loaded[0]), loaded[0]
    access = [line for line in lines if re.search(r"INFO\s+inference\s", line)]
    assert access and "model=digits-accurate" in access[0] and "status=200" in access[0], lines


def test_piped_lines_stay_json(tmp_path: Path) -> None:
    lines = serve_and_read(tmp_path, None)  # auto, and the log is a file: JSON
    assert any(line.startswith("{") and "loaded model 'digits-accurate'" in line for line in lines)
