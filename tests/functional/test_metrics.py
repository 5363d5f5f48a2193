"""Prometheus metrics scraped from a real ``fnserve serve`` under load: counts and histograms add up."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import DEMO_HOLDOUT, write_test_manifest
from tests.helpers.serving import Served, serve_with_grpc, stop
from tests.servers import start_server, wait_for

DIGITS = np.load(DEMO_HOLDOUT)["input"]


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape: (name, labels) -> value."""
    text = httpx.get(f"{url}/metrics", timeout=10).raise_for_status().text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in scrape.items() if n == name and wanted <= ls)


def body(rows: int, width: int = 64) -> dict[str, object]:
    x = DIGITS[:rows, :width]
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    """Two front processes (in-process inference) sharing the HTTP and the gRPC port."""
    served = serve_with_grpc(tmp_path_factory.mktemp("metrics"), ("--processes", "2", "--workers", "0"))
    listening = f"gRPC listening on {served.address}"
    wait_for(lambda: served.log.read_text().count(listening) == 2, 60, "both front processes to listen")
    try:
        yield served, served.url
    finally:
        stop(served)


def test_requests_over_both_transports_and_processes_add_up(two_processes: tuple[Served, str]) -> None:
    served, url = two_processes
    before = samples(url)

    def http(payload: dict[str, object], model: str = "digits-accurate") -> int:
        # A new connection each: the kernel spreads them over both processes, and either answers the scrape.
        return httpx.post(f"{url}/v2/models/{model}/infer", json=payload, timeout=30).status_code

    def grpc_call(_: int) -> None:
        client = triton.InferenceServerClient(served.address)
        inp = triton.InferInput("input", [2, 64], "FP32")
        inp.set_data_from_numpy(DIGITS[:2])
        client.infer("digits-accurate", [inp])
        client.close()

    with ThreadPoolExecutor(8) as pool:
        ok = list(pool.map(lambda i: http(body(1 + i % 3)), range(40)))
        refused = list(pool.map(lambda _: http(body(1, width=32)), range(5)))
        unknown = list(pool.map(lambda i: http(body(1), model=f"no-such-model-{i}"), range(3)))
        list(pool.map(grpc_call, range(15)))
    assert set(ok) == {200} and set(refused) == {422} and set(unknown) == {404}

    total = "fnserve_requests_total"
    counted = {  # every record of both processes, whichever answered each request
        (("model", "digits-accurate"),): 60,
        (("model", "_unknown"),): 3,
    }
    scrapes = [before]

    def flushed() -> bool:
        # The process answering the scrape flushes its records then; the other on its own timer (a second,
        # later on a busy machine): wait until each kind of record is in, not for a time.
        scrapes.append(samples(url))
        return all(
            value(scrapes[-1], total, **dict(labels)) - value(before, total, **dict(labels)) >= count
            for labels, count in counted.items()
        )

    wait_for(flushed, 60, "every process's records in the scrape")
    after = scrapes[-1]

    def added(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert added(total, model="digits-accurate", transport="http", status="200", version="1") == 40
    assert 0 < value(after, "fnserve_model_load_seconds", model="digits-accurate", version="1") < 600  # its cold start
    assert added(total, model="digits-accurate", transport="grpc", status="200", version="1") == 15
    assert added(total, model="digits-accurate", transport="http", status="422") == 5
    assert added(total, model="_unknown", transport="http", status="404") == 3
    assert not any("no-such-model" in dict(labels).get("model", "") for _, labels in after)  # bounded labels
    latency = "fnserve_request_duration_seconds"
    assert added(f"{latency}_count", model="digits-accurate", transport="http") == 40
    assert added(f"{latency}_count", model="digits-accurate", transport="grpc") == 15
    assert added(f"{latency}_bucket", model="digits-accurate", transport="http", le="+Inf") == 40
    assert added(f"{latency}_sum", model="digits-accurate") > 0
    for stage in ("decode", "infer", "encode"):
        assert added("fnserve_stage_duration_seconds_count", model="digits-accurate", stage=stage) == 55, stage


def test_batches_workers_and_respawns_are_counted(tmp_path: Path) -> None:
    manifest = write_test_manifest(tmp_path)
    manifest.write_text(
        manifest.read_text().replace('name = "digits-accurate"\n', 'name = "digits-accurate"\nmax_batch_time_ms = 20\n')
    )
    proc, url = start_server(["-m", str(manifest), "--workers", "1", "--processes", "1"], tmp_path / "serve.log")
    try:
        rows = [1 + i % 4 for i in range(30)]
        infer = f"{url}/v2/models/digits-accurate/infer"
        with ThreadPoolExecutor(10) as pool:
            statuses = list(pool.map(lambda n: httpx.post(infer, json=body(n), timeout=30).status_code, rows))
        assert set(statuses) == {200}
        scrape = samples(url)
        batches = value(scrape, "fnserve_batch_size_count", model="digits-accurate")
        assert value(scrape, "fnserve_batch_size_sum", model="digits-accurate") == sum(rows)
        assert 1 <= batches < 30  # concurrent requests shared batches
        assert value(scrape, "fnserve_batch_queue_depth", model="digits-accurate") == 0
        assert value(scrape, "fnserve_inference_workers", device="workers", state="idle") == 1
        assert value(scrape, "fnserve_inference_workers", device="workers", state="busy") == 0
        # Where each model runs, as its workers said: the front process loads none itself.
        placement = dict(model="digits-accurate", version="1", providers="CPUExecutionProvider", device="cpu")
        assert value(scrape, "fnserve_model_placement_info", **placement, fallback="false") == 1
        assert value(scrape, "fnserve_model_load_seconds", model="digits-accurate", version="1") > 0  # its worker's
        assert value(scrape, "fnserve_worker_respawns_total") == 0

        worker = next(
            int(c)
            for task in Path(f"/proc/{proc.pid}/task").iterdir()
            for c in (task / "children").read_text().split()
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()
        )
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: value(samples(url), "fnserve_worker_respawns_total") == 1, 30, "the respawn to be counted")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
