"""perf_analyzer, Triton's load generator, drives ``fnserve serve`` with no proxy or shim, over HTTP and gRPC,
on a model and on a text pipeline; and ``fnserve bench``'s driver of it counts what the server answered."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from fnserve.bench import perf_analyzer
from fnserve.bench.requests import Request
from tests.helpers import DEMO_MANIFEST, REPO
from tests.helpers.serving import Served, stop
from tests.servers import free_port, start_server

PERF_ANALYZER = REPO / ".perf-analyzer" / "perf_analyzer"  # make perf-analyzer (a prerequisite of make test)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if not PERF_ANALYZER.exists():
        pytest.fail("perf_analyzer is not set up: run make perf-analyzer (make test does)")
    port = free_port()
    log = tmp_path_factory.mktemp("perf-analyzer") / "serve.log"
    proc, url = start_server(["-m", str(DEMO_MANIFEST), "--grpc-port", str(port)], log, new_session=True)
    served = Served(proc, f"127.0.0.1:{port}", log, url)
    yield served
    stop(served)


def successes(url: str, model: str) -> int:
    stats = httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def measure(served: Served, model: str, protocol: str, tmp: Path, *extra: str) -> dict[str, str]:
    address = served.address if protocol == "grpc" else served.url.removeprefix("http://")
    out = tmp / f"{model}-{protocol}.csv"
    command = [str(PERF_ANALYZER), "-m", model, "-u", address, "-i", protocol, "--concurrency-range", "4:4"]
    command += ["--measurement-interval", "500", "--stability-percentage", "100", "-f", str(out), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Server:" in done.stdout  # it read the server's statistics for the window
    return next(csv.DictReader(out.read_text().splitlines()))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_drives_a_model(served: Served, protocol: str, tmp_path: Path) -> None:
    before = successes(served.url, "digits-accurate")
    row = measure(served, "digits-accurate", protocol, tmp_path)
    assert float(row["Inferences/Second"]) > 0 and float(row["p99 latency"]) > 0
    assert float(row["Server Compute Infer"]) > 0  # from fnserve's statistics
    assert successes(served.url, "digits-accurate") - before > 100


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_drives_a_text_pipeline(served: Served, protocol: str, tmp_path: Path) -> None:
    texts = ["the cat sat on the mat", "serverless inference of small models on two cores"]
    data = tmp_path / "texts.json"
    data.write_text(json.dumps({"data": [{"text": {"content": [t], "shape": [1]}} for t in texts]}))
    before = successes(served.url, "minilm-embed")
    row = measure(served, "minilm-embed", protocol, tmp_path, "--input-data", str(data))
    assert float(row["Inferences/Second"]) > 0
    assert successes(served.url, "minilm-embed") - before > 10


def test_perf_analyzer_drives_an_image_pipeline_from_the_bench_drivers_input_data(
    served: Served, tmp_path: Path
) -> None:
    image = Image.fromarray(np.full((16, 16), 255, np.uint8))
    png = io.BytesIO()
    image.save(png, format="PNG")
    request = Request(b"", {}, {"image": np.array([png.getvalue()], dtype=object)})
    data = tmp_path / "images.json"
    data.write_text(json.dumps(perf_analyzer.input_data([request])))  # the tensor's wire bytes, in base64
    before = successes(served.url, "digits-image")
    row = measure(served, "digits-image", "http", tmp_path, "--input-data", str(data))
    assert float(row["Inferences/Second"]) > 0
    assert successes(served.url, "digits-image") - before > 10


def test_the_bench_driver_counts_what_the_server_answered(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{PERF_ANALYZER.parent}:{os.environ['PATH']}")
    assert perf_analyzer.have()  # fnserve bench's auto generator picks it
    x = np.load(DEMO_MANIFEST.parent / "digits-holdout.npz")["input"][:1]
    request = Request(b"", {"Content-Type": "application/json"}, {"input": x})
    assert perf_analyzer.input_data([request])["data"][0]["input"]["shape"] == [64]
    port = int(served.url.rsplit(":", 1)[1])
    found = perf_analyzer.run(port, "digits-accurate", [request], concurrency=2, seconds=1.5)
    assert found.generator == "perf_analyzer" and found.errors == 0
    assert found.requests > 100 and found.rate > 0 and 0 < found.p50 <= found.p99
    assert set(found.stages) == {"queue", "compute_input", "compute_infer", "compute_output"}
