"""Server metrics in memory: buffered records give the series prometheus-client's own observe would."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from fnserve.observability.metrics import FLUSH_AT, LATENCY_BUCKETS, ServerMetrics


def series(metrics: ServerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = metrics.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_flushed_records_equal_direct_observations() -> None:
    metrics = ServerMetrics()
    http = metrics.telemetry("http")
    reference = Histogram("ref", "", ["model", "stage"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
    rng = random.Random(0)
    for i in range(500):
        timings = {"decode": rng.uniform(0, 0.5), "infer": rng.choice([0.05, 1.0, 2.5, 30.0]), "encode": 0.01}
        if i % 7 == 0:
            timings = {}  # a refusal: counted, not timed
        http.record("m", 200 if timings else 422, timings, "off", "1" if timings else "")
        for stage, ms in timings.items():
            reference.labels("m", stage).observe(ms / 1e3)
    got = series(metrics)
    want = {
        (name.replace("ref", "fnserve_stage_duration_seconds"), labels): value
        for (name, labels), value in series_of(reference).items()
    }
    stages = {k: v for k, v in got.items() if k[0].startswith("fnserve_stage_duration_seconds")}
    stages = {k: v for k, v in stages.items() if not k[0].endswith("_created")}
    assert stages.keys() == want.keys()
    for key, value in want.items():  # bucket counts exactly; sums up to the order of float additions
        assert stages[key] == (pytest.approx(value) if key[0].endswith("_sum") else value), key
    ok = {"model": "m", "version": "1", "transport": "http", "status": "200"}
    refused = {"model": "m", "version": "", "transport": "http", "status": "422"}
    assert got[("fnserve_requests_total", frozenset(ok.items()))] == 428
    assert got[("fnserve_requests_total", frozenset(refused.items()))] == 72


def series_of(histogram: Histogram) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in histogram.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_records_wait_for_a_flush_and_flush_themselves_when_many() -> None:
    metrics = ServerMetrics()
    grpc = metrics.telemetry("grpc")
    grpc.record("m", 200, {"infer": 1.0}, "off", "1")
    assert metrics.pending and metrics.requests.labels("m", "1", "grpc", "200")._value.get() == 0  # noqa: SLF001
    for _ in range(FLUSH_AT):
        grpc.record("m", 200, {"infer": 1.0}, "off", "1")
    assert len(metrics.pending) < FLUSH_AT
    metrics.flush()
    assert metrics.requests.labels("m", "1", "grpc", "200")._value.get() == FLUSH_AT + 1  # noqa: SLF001


DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "fnserve-dashboard.json"


def test_the_grafana_dashboard_queries_only_metrics_the_server_exports() -> None:
    exported = set()
    for family in ServerMetrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + suffix for suffix in suffixes}
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bfnserve_[a-z_]+", target["expr"])
    }
    assert queried and queried <= exported, queried - exported
    assert {"fnserve_requests_total", "fnserve_stage_duration_seconds_bucket", "fnserve_batch_size_sum"} <= queried
