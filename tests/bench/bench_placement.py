"""Memory of one server with many models: every worker holding every model, against worker groups.

    make bench        (or: python -m tests.bench.bench_placement)

The demo manifest plus three more copies of MiniLM (four in all), served by ``fnserve serve`` two ways with
the same number of inference workers (four): ``--workers 4``, each worker holding every model; and the
manifest's ``[[groups]]``, each MiniLM in a group of one worker and the digits models in the front process.
Printed for each: the server's processes with their resident and proportional memory (PSS: shared pages
split between the processes that share them, so the sum is what the server takes), read from /proc once
every model answers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from fnserve.bench.sweep import process_tree
from tests.helpers import DEMO_MANIFEST
from tests.moto import free_port
from tests.servers import start_http

COPIES = ("minilm-copy-1", "minilm-copy-2", "minilm-copy-3")


def manifest(directory: Path, groups: bool) -> Path:
    """The demo manifest with absolute paths, three more MiniLMs, and (``groups``) a worker group for each MiniLM."""
    data: dict[str, Any] = tomllib.loads(DEMO_MANIFEST.read_text())
    for model in data["models"]:
        model["path"] = str(DEMO_MANIFEST.parent / model["path"])
    for pipeline in data.get("pipelines", []):
        for step in (*pipeline.get("pre", []), *pipeline.get("post", [])):
            for key in ("tokenizer", "labels"):
                if key in step:
                    step[key] = str(DEMO_MANIFEST.parent / step[key])
    minilm = next(m for m in data["models"] if m["name"] == "minilm-l6")
    data["models"] += [{**minilm, "name": name} for name in COPIES]
    if groups:
        data["groups"] = [{"name": name, "workers": 1, "models": [name]} for name in ("minilm-l6", *COPIES)]
    path = directory / f"manifest-{'groups' if groups else 'flat'}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def memory_mb(pid: int) -> tuple[float, float]:
    """A process's resident and proportional set sizes (MB)."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key] = int(rest.split()[0]) / 1024
    return values["Rss"], values["Pss"]


def command_of(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    if "resource_tracker" in text:
        return "resource tracker"
    return "inference worker" if "spawn_main" in text else "front process"


def measure(directory: Path, groups: bool) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "fnserve", "serve", "-m", str(manifest(directory, groups)), "--port", str(port)]
    if not groups:
        cmd += ["--processes", "1", "--workers", "4"]
    env = {**os.environ, "FNSERVE_ACCESS_LOG": "false", "FNSERVE_LOG_FORMAT": "json"}
    proc, url = start_http(cmd, port, directory / f"serve-{'groups' if groups else 'flat'}.log", env=env)
    try:
        tokens = {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": [101, 2000, 2001, 102]}
        body = {
            "inputs": [
                tokens,
                {**tokens, "name": "attention_mask", "data": [1, 1, 1, 1]},
                {**tokens, "name": "token_type_ids", "data": [0, 0, 0, 0]},
            ]
        }
        for name in ("minilm-l6", *COPIES):  # every copy answers: each is loaded where it runs
            response = httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=60)
            response.raise_for_status()
        pids = process_tree(proc.pid)
        rows = [(pid, command_of(pid) if pid != proc.pid else "front process", *memory_mb(pid)) for pid in pids]
        flat = "--workers 4: every worker, every model"
        print(f"\n{'worker groups: each MiniLM in a group of 1 worker' if groups else flat}")
        for pid, role, rss, pss in rows:
            print(f"  {pid:>8} {role:<17} RSS {rss:7.0f} MB  PSS {pss:7.0f} MB")
        print(f"  total: PSS {sum(r[3] for r in rows):,.0f} MB over {len(rows)} processes")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-placement-"))
    print("placement: the demo manifest and three more MiniLMs (four), four inference workers either way")
    try:
        for groups in (False, True):
            measure(work, groups)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
