"""Prometheus metrics of ``fnserve serve`` on ``GET /metrics`` (prometheus-client), across its processes.

Per request, from each transport's telemetry record (HTTP and gRPC): a count by model,
version, transport and status, and a latency histogram per stage (decode, a pipeline's pre,
queue, infer, a pipeline's post, encode) and in total. Per batch, from the adaptive batchers:
its rows. At each scrape, from the process's own state: batcher queue depth, inference
workers busy and idle, worker respawns, cache lookups by tier and result, cache backend errors. From the
process supervising several front processes: those it replaced (:func:`front_respawns`).

Several front processes (``--processes``) share one port and each may answer a scrape: the
server points ``PROMETHEUS_MULTIPROC_DIR`` at a directory of its own before any process
imports prometheus-client (:func:`fnserve.server.serve.serve`), every process writes its values
there, and any of them reports the sum (prometheus-client's multiprocess mode). Labels stay
low-cardinality: the manifest's model names (a name no model has is ``_unknown``), versions,
stages, transports and status codes, never request data. Without the directory (one process,
or tests), the values live in memory.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from fnserve.core.batching.scheduler import BatchObservers
from fnserve.observability.gpu_metrics import GpuCollector, gpu_collector
from fnserve.observability.periodic import Every

if TYPE_CHECKING:
    from fnserve.core.serving.dataplane import DataPlane


class _Workers(Protocol):
    def busy(self) -> int: ...
    def worker_pids(self) -> list[int]: ...


class _Group(Protocol):
    @property
    def device(self) -> str: ...
    @property
    def pool(self) -> _Workers: ...


class WorkerGroups(Protocol):
    """What the metrics read of a server's worker pool (``fnserve.workers.remote``'s ``Pools`` or ``Overflow``)."""

    @property
    def groups(self) -> Sequence[_Group]: ...
    @property
    def runs(self) -> Mapping[str, int]: ...
    @property
    def respawns(self) -> int: ...


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNKNOWN = "_unknown"
# How stale another process's figures may be in a scrape; also how long the event loop holds records before adding
# them up: held for a whole second, the adding up stalls a busy front process (docs/design/observability.md).
FLUSH_SECONDS = 0.1
FLUSH_AT = 2_000  # records kept before a flush, whatever the time
# Milliseconds-to-seconds stages; buckets from a tiny model's stage to a slow model's whole run.
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def front_respawns() -> Callable[[], None]:
    """Counts front processes replaced after dying: the supervising process's series, in the multiprocess
    directory beside the front processes' own, so whichever answers a scrape reports it."""
    counter = Counter("fnserve_front_respawns", "Front processes replaced after dying.", registry=None)
    return counter.inc


class ServerMetrics:
    """The metrics of one front process; :meth:`telemetry` and :meth:`batch_observer` feed it, :meth:`render`
    answers a scrape (after :meth:`watch` gave it the process's data plane and pool). A companion of the
    app: its lifespan starts the periodic flush and flushes at shutdown."""

    def __init__(self, gpu: GpuCollector | None | Literal["auto"] = "auto") -> None:
        # The machine's GPUs (nv_gpu_*, read at each scrape): NVML's, where it sees any ("auto").
        self._gpus = CollectorRegistry()
        if (collector := gpu_collector() if gpu == "auto" else gpu) is not None:
            self._gpus.register(collector)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "fnserve_requests",
            "Inference requests answered, by model, version, transport and status (HTTP status code).",
            ["model", "version", "transport", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "fnserve_request_duration_seconds",
            "Time to answer an inference request (decode to encode), successful ones.",
            ["model", "transport"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stages = Histogram(
            "fnserve_stage_duration_seconds",
            "Time in each stage of an inference request: decode, a pipeline's pre steps, queue (waiting for a batch), "
            "infer, a pipeline's post steps, encode.",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "fnserve_batch_size",
            "Rows in each batch the adaptive batcher ran.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_splits = Counter(
            "fnserve_batch_splits",
            "Failed batches split in halves and run again, to answer every request but the one at fault.",
            ["model"],
            registry=r,
        )
        self.shed = Counter(
            "fnserve_requests_shed",
            "Requests an adaptive batcher refused at once (503, gRPC UNAVAILABLE), never run, by reason: queue_wait "
            "(the rows ahead would take past max_queue_delay_ms, or answer it past its client's deadline), "
            "queue_deadline (max_queue_delay_ms passed before a batch) or queue_full (max_queue_size rows waited).",
            ["model", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "fnserve_batch_queue_depth",
            "Rows waiting in the adaptive batcher for a batch, by model.",
            ["model"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.workers = Gauge(
            "fnserve_inference_workers",
            "Inference worker processes by device group (gpu, cpu, or workers) and state (busy: running a call; idle).",
            ["device", "state"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.device_calls = Counter(
            "fnserve_device_calls",
            "Inference calls (a batch, or a request) sent to each device group of the worker pool: a mixed pool's "
            "overflow to the CPU shows here.",
            ["device"],
            registry=r,
        )
        self.placement = Gauge(
            "fnserve_model_placement_info",
            "1 for each model version's placement: its execution providers, device, and whether a GPU provider "
            "asked for fell back to the CPU (cpu_fallback).",
            ["model", "version", "providers", "device", "fallback"],
            multiprocess_mode="max",
            registry=r,
        )
        self.load_seconds = Gauge(
            "fnserve_model_load_seconds",
            "Seconds each model version took to load in this server: fetch, checksum, session(s), warm-up (what a "
            "cold start pays for it).",
            ["model", "version"],
            multiprocess_mode="max",
            registry=r,
        )
        self.respawns = Counter("fnserve_worker_respawns", "Inference workers replaced after dying.", registry=r)
        self.cache_lookups = Counter(
            "fnserve_cache_lookups",
            "Result cache lookups by model (or pipeline), tier and result (hit in the local or the remote tier, miss).",
            ["model", "tier", "result"],
            registry=r,
        )
        self.cache_errors = Counter(
            "fnserve_cache_backend_errors",
            "Failed calls to the remote cache tier (each degrades to a miss).",
            registry=r,
        )
        self.known: frozenset[str] | None = None  # the served names; any other is counted as UNKNOWN
        self._plane: DataPlane | None = None
        self._pool: WorkerGroups | None = None
        self._seen: dict[str, int] = {}
        self.pending: list[tuple[str, str, str, int, dict[str, float]]] = []  # records not yet in the series
        self.pending_shed: dict[tuple[str, str], int] = {}  # refusals not yet counted, by model and reason
        self._flusher = Every(FLUSH_SECONDS, self.flush)

    def watch(self, plane: DataPlane, pool: WorkerGroups | None = None) -> None:
        """Say where each of ``plane``'s loaded models runs, and read its batchers, its cache and ``pool`` at each
        scrape (its batches are counted by the observers it was built with, :meth:`batch_observers`)."""
        self._plane = plane
        self._pool = pool
        registry = plane.service.registry
        for name in registry.names():
            for version in registry.versions(name):
                if registry.in_process and not registry.is_loaded(name, version):
                    continue  # loaded on first use; models in workers are described, loaded or not here
                loaded = registry.get(name, version)
                placement = loaded.placement
                if loaded.load_seconds:
                    self.load_seconds.labels(name, version).set(loaded.load_seconds)
                fallback = str(placement.fallback is not None).lower()
                self.placement.labels(name, version, ",".join(placement.providers), placement.device, fallback).set(1)
        self.known = plane.names

    def telemetry(self, transport: str) -> RequestMetrics:
        """The per-request record of one transport (``http``, ``grpc``)."""
        return RequestMetrics(self, transport)

    def _shed(self, model: str, reason: str) -> None:
        """A refusal, counted at the next flush with the requests' records: under overload a server refuses
        thousands a second, and prometheus-client's ``labels(...).inc()`` each cost more than the refusal's own
        decision."""
        key = (model, reason)
        self.pending_shed[key] = self.pending_shed.get(key, 0) + 1

    def batch_observers(self, model: str) -> BatchObservers:
        """What ``model``'s batcher tells these metrics: each batch's rows, each split of a failed batch, and each
        refusal (counted at the next flush)."""
        return BatchObservers(
            on_batch=self.batch_rows.labels(model).observe,
            on_split=self.batch_splits.labels(model).inc,
            on_shed=functools.partial(self._shed, model),
        )

    async def start(self) -> None:
        """Flush this process's records every :data:`FLUSH_SECONDS` (the app's lifespan starts it)."""
        await self._flusher.start()

    async def stop(self) -> None:
        await self._flusher.stop()

    def flush(self) -> None:
        """Add up the records since the last flush and write each series they touch once: records grouped by
        their labels, then each stage's durations of a group observed together (:func:`_observe_all`)."""
        records, self.pending = self.pending, []
        sheds, self.pending_shed = self.pending_shed, {}
        for (model, reason), count in sheds.items():
            self.shed.labels(model, reason).inc(count)
        known = self.known
        groups: dict[tuple[str, str, str, int], list[dict[str, float]]] = {}
        for model, version, transport, status, timings in records:
            key = (model, version, transport, status)
            group = groups.get(key)
            if group is None:
                groups[key] = [timings]
            else:
                group.append(timings)
        for (model, version, transport, status), all_timings in groups.items():
            if known is not None and model not in known:
                model = UNKNOWN  # a name a client made up: not a label value of its own (unbounded series)
            self.requests.labels(model, version, transport, str(status)).inc(len(all_timings))
            timed = [t for t in all_timings if t]
            if not timed:
                continue
            stages = dict.fromkeys(timed[0])
            if any(t.keys() != stages.keys() for t in timed):  # stages differ within the group (rarely)
                stages = dict.fromkeys(stage for t in timed for stage in t)
            for stage in stages:
                values = [t[stage] for t in timed if stage in t]
                _observe_all(self.stages.labels(model, stage), values)
            _observe_all(self.latency.labels(model, transport), [sum(t.values()) for t in timed])

    def render(self) -> bytes:
        """The exposition of every process of this server (this one's records flushed and scrape-time figures
        updated first; the other processes flush theirs within :data:`FLUSH_SECONDS`)."""
        self.flush()
        self._update()
        path = os.environ.get(MULTIPROC_ENV)
        gpus = generate_latest(self._gpus)  # machine-wide, read now: not through the processes' files
        if not path:
            return generate_latest(self.registry) + gpus
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        return generate_latest(registry) + gpus

    def _update(self) -> None:
        if self._plane is not None:
            for model, batcher in self._plane.batchers.items():
                self.queue_depth.labels(model).set(batcher.queued())
            cache = self._plane.service.cache
            if cache is not None:
                for model, stats in list(cache.by_model.items()):
                    for tier, result, field in (("local", "hit", "local_hits"), ("remote", "hit", "remote_hits")):
                        self._advance(
                            self.cache_lookups.labels(model, tier, result), f"{field}-{model}", getattr(stats, field)
                        )
                    self._advance(self.cache_lookups.labels(model, "all", "miss"), f"misses-{model}", stats.misses)
                self._advance(self.cache_errors, "errors", cache.stats.errors)
        if self._pool is not None:
            for group in self._pool.groups:
                busy = group.pool.busy()
                self.workers.labels(group.device, "busy").set(busy)
                self.workers.labels(group.device, "idle").set(len(group.pool.worker_pids()) - busy)
                self._advance(
                    self.device_calls.labels(group.device), f"calls-{group.device}", self._pool.runs[group.device]
                )
            self._advance(self.respawns, "respawns", self._pool.respawns)

    def _advance(self, counter: Counter, key: str, total: int) -> None:
        """Bring ``counter`` up to a running ``total`` kept elsewhere (counters only go up)."""
        delta = total - self._seen.get(key, 0)
        if delta > 0:
            counter.inc(delta)
            self._seen[key] = total


class RequestMetrics:
    """The :class:`~fnserve.observability.envelope.Telemetry` of one transport, into :class:`ServerMetrics`.

    A record is appended to a list; :meth:`ServerMetrics.flush` adds them up and writes each series
    once: prometheus-client's own counter and histograms, observed per request, cost a large share of a
    small model's request (docs/design/observability.md).
    """

    def __init__(self, metrics: ServerMetrics, transport: str) -> None:
        self.metrics = metrics
        self.transport = transport

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None:
        pending = self.metrics.pending
        pending.append((model, version, self.transport, status, timings))
        if len(pending) >= FLUSH_AT:
            self.metrics.flush()


def _observe_all(child: Histogram, milliseconds: Sequence[float]) -> None:
    """``child.observe(ms / 1e3)`` for every value, each bucket and the sum written once.

    prometheus-client has no bulk observation; this adds to the series ``observe`` adds to
    (the child's ``_sum`` and ``_buckets``, stable since its first releases; test_metrics
    checks every count and sum against the requests sent). The buckets are found by
    ``searchsorted`` over them all (``observe``'s own test, a value in the first bucket whose
    bound is at least it).
    """
    seconds = np.asarray(milliseconds, dtype=np.float64) / 1e3
    bounds = child._upper_bounds  # noqa: SLF001
    hits = np.bincount(np.searchsorted(bounds, seconds), minlength=len(bounds))
    child._sum.inc(float(seconds.sum()))  # noqa: SLF001
    for bucket, n in zip(child._buckets, hits.tolist(), strict=True):  # noqa: SLF001
        if n:
            bucket.inc(n)
