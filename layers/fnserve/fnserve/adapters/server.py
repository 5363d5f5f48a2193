"""The long-running server: one front process under uvicorn, and a pool of inference workers.

The front process parses HTTP, validates, caches, batches and runs cascades; with
``parallel_workers >= 1`` the models live in that many worker processes (spawned, warm, see
:mod:`fnserve.workers.remote`), so inference runs in parallel beside the event loop. With
``parallel_workers = 0`` inference runs in the front process itself: no inter-process hop,
which is the better choice for models so small that the hop costs more than the model
(``make bench`` shows where that line is).

Given neither (no ``--workers``, ``--processes`` or their variables), :func:`choose_layout`
decides at start, from the loaded models: inference in the front processes (measured faster
than a worker pool for light and heavy models alike on the bench machine), one per CPU, as many
as fit in memory, or one with every CPU's threads when a model batches adaptively and one
batcher serves it faster (timed both ways at start); the start log gives the times and the reason.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from fnserve import bootstrap, tracing
from fnserve.adapters import fronts
from fnserve.adapters.envelope import Telemetry
from fnserve.adapters.http.app import V2App, create_app
from fnserve.adapters.http.routes import Companion
from fnserve.adapters.logs import logger
from fnserve.adapters.starting import not_ready_until_loaded
from fnserve.core._cpus import AFFINITY_DIR_ENV, available_cpus
from fnserve.core._heap import freeze_heap
from fnserve.core.dataplane import DataPlane
from fnserve.core.errors import ConfigError
from fnserve.core.providers import DEVICE_ENV
from fnserve.core.registry import LoadedModel, Session, session_options, zeros_feed
from fnserve.core.service import InferenceService
from fnserve.settings import Settings
from fnserve.workers.pool import FunctionSpec, WorkerPool
from fnserve.workers.remote import Group, Overflow


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_ready: Callable[[InferenceService, Settings], None] | None = None,
) -> None:
    """Load every model (in the workers, or here with no workers), then serve until SIGINT or SIGTERM.

    On a signal, requests in flight finish, then the workers stop (the app's lifespan). The
    workers ignore signals themselves, and exit on their own if this process is killed
    outright (their pipe to it closes). With ``server_processes > 1``, that many front processes serve the
    port (:mod:`fnserve.adapters.fronts`), each building its own app (:func:`app_factory`).
    """
    made: list[str | None] = [metrics_dir() if settings.metrics else None]
    if settings.cpu_affinity:  # the slot locks of the processes pinned to CPUs (bootstrap.pin_inference)
        locks = tempfile.mkdtemp(prefix="fnserve-cpus-")
        made.append(locks)
        os.environ[AFFINITY_DIR_ENV] = locks
    try:
        _serve(settings, host, port, on_ready)
    finally:
        for path in made:
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)


def metrics_dir() -> str | None:
    """Point ``PROMETHEUS_MULTIPROC_DIR`` at a new directory, before any process imports prometheus-client
    (it reads the variable then), for every front process to write its metrics to; returns it, to be removed
    at exit. None when the variable is set already: the directory is the user's."""
    if os.environ.get(MULTIPROC_ENV):
        return None
    path = tempfile.mkdtemp(prefix="fnserve-metrics-")
    os.environ[MULTIPROC_ENV] = path
    return path


def _serve(
    settings: Settings, host: str, port: int, on_ready: Callable[[InferenceService, Settings], None] | None
) -> None:
    import uvicorn

    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        "http": "httptools",
        "access_log": False,
        "log_level": "warning",
    }
    with not_ready_until_loaded(host, port):
        settings, app = _load(settings, host, on_ready)
    if app is None:
        fronts.run(f"{__name__}:app_factory", settings.server_processes, options)
        return
    try:
        uvicorn.Server(uvicorn.Config(app, **options)).run()
    finally:
        if app.state.pool is not None:  # the lifespan closed it already, unless uvicorn never started
            app.state.pool.close()


def _load(
    settings: Settings, host: str, on_ready: Callable[[InferenceService, Settings], None] | None
) -> tuple[Settings, V2App | None]:
    """Every model loaded, and the layout chosen: the one front process's app, or None (and the settings the
    front processes get) when several serve the port, each building its own."""
    update: dict[str, Any] = {"eager_load": True}
    if "grpc_host" not in settings.model_fields_set:
        update["grpc_host"] = host  # gRPC listens where HTTP does, unless told otherwise
    settings = bootstrap.with_local_manifest(settings.model_copy(update=update))
    if settings.gpu_workers and "parallel_workers" not in settings.model_fields_set:
        # GPU workers alone, unless CPU workers to overflow to are asked for.
        settings = settings.model_copy(update={"parallel_workers": 0})
    auto = not {"parallel_workers", "server_processes", "gpu_workers"} & settings.model_fields_set
    checked: InferenceService | None = None
    if auto or settings.server_processes > 1:
        # Every model is loaded here once: one that cannot load stops the start with its reason,
        # instead of uvicorn's supervisor restarting front processes that cannot start.
        checked = bootstrap.build_service(settings, bootstrap.result_store(settings, for_requests=True))
        if auto:
            layout = choose_layout(checked, available_cpus(), settings.intra_op_threads)
            settings = settings.model_copy(
                update={"server_processes": layout.processes, "parallel_workers": layout.workers}
            )
            logger.info(
                f"serving layout: {layout.processes} front process(es), {layout.workers} inference worker(s) each: "
                f"{layout.why}",
                extra={
                    "processes": layout.processes,
                    "workers": layout.workers,
                    "batch1_ms": {name: round(ms, 4) for name, ms in layout.batch1_ms.items()},
                },
            )
        if settings.server_processes > 1:
            if on_ready is not None:
                on_ready(checked, settings)
            del checked
            os.environ.update(settings_env(settings))  # how the settings reach the front processes
            return settings, None
    # One front process: running inference itself, it serves the models loaded (and timed) above.
    loaded = checked if not pooled(settings) else None
    del checked
    app = front(settings, loaded)
    if on_ready is not None:
        try:
            on_ready(app.state.plane.service, settings)
        except BaseException:
            if app.state.pool is not None:
                app.state.pool.close()
            raise
    return settings, app


# A request's round trip to an inference worker (pipe, pickling, the worker's wake-up) costs
# ~0.7 ms on the bench machine (bench_serve): a model whose batch-1 run is a small part of it
# is served faster by the front processes themselves. Heavier models measured the same way
# (MiniLM int8, bench_serve, three runs each) gave the same answer: one worker reached
# 0.52-0.87x raw ORT capacity (the front process's HTTP and JSON take CPU from the worker),
# inference in one front process per CPU 0.88-0.94x without adaptive batching; with it, one
# front process with every CPU's threads 0.81-0.90x, and one per CPU 0.93x once each front
# process had a socket of its own (it swung between 0.49x and 1.01x when they shared one, see
# fnserve.adapters.fronts). So the default runs inference in the front processes: one per CPU
# (as many as fit in memory), or one when a model batches and one batcher serves it faster
# (one_batcher); a worker pool stays one flag away (--workers).
WORKER_ROUND_TRIP_MS = 0.7
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
IN_PROCESS_MAX_MS = WORKER_ROUND_TRIP_MS / 4
_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Layout:
    """How a server runs: front processes, inference workers in each, and why."""

    processes: int
    workers: int
    why: str
    batch1_ms: dict[str, float]


def choose_layout(
    service: InferenceService,
    cpus: int,
    intra_op_threads: int | None = None,
    process_bytes: int | None = None,
    available_bytes: int | None = None,
    single_session: Callable[[LoadedModel, int], Session] | None = None,
) -> Layout:
    """Inference in the front processes: one per CPU (per ``intra_op_threads``), as many as fit in memory; or one
    with every CPU's threads when a model batches adaptively and one batcher serves it faster (:func:`one_batcher`).

    ``process_bytes``: what one front process with every model loaded takes; ``available_bytes``:
    the memory free for them (both read from /proc when not given; no bound where unknown).
    ``single_session``: a CPU session of a model with the given threads (:func:`one_batcher`'s comparison).
    """
    times = {name: batch1_ms(service.registry.get(name)) for name in service.registry.names()}
    heaviest = max(times, key=lambda name: times[name])
    slowest = times[heaviest]
    threads = intra_op_threads or 1
    processes = max(1, cpus // threads)
    batching = sorted(m.name for m in service.registry.manifest.models if m.max_batch_time_ms is not None)
    split = ""
    if batching:
        verdicts = {
            name: one_batcher(service.registry.get(name), processes, threads, single_session)
            if processes > 1
            else (True, f"{cpus} CPU(s) at {threads} thread(s) a process: room for one process")
            for name in batching
        }
        whole = [(name, why) for name, (one, why) in verdicts.items() if one]
        if whole:
            name, why = whole[0]
            reason = (
                f"{name!r} batches adaptively and one batcher serves it faster ({why}), so one front process with "
                f"every CPU's threads ({cpus}) runs inference: one batcher, whole batches"
            )
            return Layout(1, 0, reason, times)
        split = "; ".join(f"{name!r} batches adaptively, faster split ({why})" for name, (_, why) in verdicts.items())
    process_bytes = process_bytes if process_bytes is not None else _rss_bytes()
    available_bytes = available_bytes if available_bytes is not None else _available_bytes()
    fits = ""
    if process_bytes and available_bytes is not None and processes * process_bytes > available_bytes * 0.8:
        processes = max(1, int(available_bytes * 0.8) // process_bytes)
        fits = f", {processes} of them as fit in 80% of the free memory ({process_bytes / 2**20:.0f} MiB each)"
    if split:
        why = split
    elif slowest <= IN_PROCESS_MAX_MS:
        why = (
            f"every model's batch-1 run is well under a worker round trip (~{WORKER_ROUND_TRIP_MS} ms; "
            f"the slowest, {heaviest!r}, takes {slowest:.3f} ms)"
        )
    else:
        shown = "cannot be timed on zeros" if math.isinf(slowest) else f"takes {slowest:.2f} ms at batch 1"
        why = (
            f"{heaviest!r} {shown}: heavy, and a worker's hop would still take CPU from inference "
            "(--workers N puts models in worker processes)"
        )
    return Layout(processes, 0, f"{why}; inference runs in the front processes, one per CPU ({cpus}){fits}", times)


# A batching model's whole batches are timed at this many rows (or its max_batch_size, when smaller).
BATCH_ROWS = 16


def one_batcher(
    model: LoadedModel,
    processes: int,
    threads: int = 1,
    single_session: Callable[[LoadedModel, int], Session] | None = None,
) -> tuple[bool, str]:
    """Whether a model that batches adaptively is served faster by one front process with every CPU's threads
    (one batcher, whole batches) than by ``processes`` front processes of ``threads`` threads each (each batching
    its share of the requests), and the figures that say so, on zeros at its middle length bucket.

    A tiny model is served by one batcher: HTTP costs more than the model, and one batcher fills its batches
    where split ones wait out their windows half full (digits: 7.9k requests/s against 4.5k, bench_serve). A
    model on a GPU too. A heavy one on CPUs is timed both ways: on 2 cores MiniLM int8 runs 16 rows of 48 tokens
    on 2 threads slower than 2 single-threaded processes run 8 rows each (ONNX Runtime gains little from a
    second thread), and split front processes served it at 0.93-0.96x raw capacity against 0.86x (bench_serve),
    text to embeddings at 0.88-0.92x the naive server against 0.68-0.73x (bench_pipeline).
    """
    settings = model.settings
    if model.placement.device != "cpu":
        return True, f"it runs on {model.placement.device}"
    buckets = settings.length_buckets or [1]
    length = buckets[len(buckets) // 2]
    rows = min(BATCH_ROWS, settings.max_batch_size)
    share = max(1, rows // processes)

    def feed(n: int) -> dict[str, Any]:
        return zeros_feed(model.inputs, n, length, settings.pad_inputs)

    one = run_ms(model.session, model.output_names, feed(1))
    if one <= IN_PROCESS_MAX_MS or math.isinf(one):
        return True, f"{one:.3f} ms at batch 1: HTTP costs more than the model, and one batcher fills its batches"
    whole = rows / run_ms(model.session, model.output_names, feed(rows)) * 1e3
    session = (single_session or _cpu_session)(model, threads)
    split = processes * share / run_ms(session, model.output_names, feed(share)) * 1e3
    sizes = f"{rows} rows of {length}" if settings.length_buckets else f"{rows} rows"
    why = (
        f"{whole:,.0f} rows/s in batches of {sizes} on one process's threads, against {split:,.0f} from "
        f"{processes} processes of {threads} thread(s) batching {share} rows each"
    )
    return whole >= split, why


def _cpu_session(model: LoadedModel, threads: int) -> Session:
    """A CPU session of ``model``, as the registry makes it but with ``threads`` intra-op threads, for
    :func:`one_batcher`'s timing."""
    options = session_options(model.settings, threads)
    session: Session = ort.InferenceSession(str(model.path), sess_options=options, providers=["CPUExecutionProvider"])
    return session


def _rss_bytes() -> int | None:
    """This process's resident memory: what a front process with every model loaded will take, about."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _available_bytes() -> int | None:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def batch1_ms(model: LoadedModel) -> float:
    """Median milliseconds of a batch-1 run on zeros (inf for a model that rejects zeros)."""
    return run_ms(model.session, model.output_names, zeros_feed(model.inputs))


def run_ms(
    session: Session, outputs: Sequence[str], feed: dict[str, Any], runs: int = 20, budget_seconds: float = 0.25
) -> float:
    """Median milliseconds of ``session`` running ``feed`` (inf when it refuses it: a model may reject zeros).

    One run to warm up, then up to ``runs`` timed ones within ``budget_seconds`` (at least one):
    a heavy model adds about a quarter of a second to the start, not twenty of its runs.
    """
    try:
        session.run(outputs, feed)
        samples: list[float] = []
        deadline = time.perf_counter() + budget_seconds
        while len(samples) < runs and (not samples or time.perf_counter() < deadline):
            t0 = time.perf_counter()
            session.run(outputs, feed)
            samples.append(time.perf_counter() - t0)
    except Exception:  # a model may reject zeros (indices, say): it is not timed
        return math.inf
    return statistics.median(samples) * 1e3


def app_factory() -> V2App:
    """One front process of a multi-process server (uvicorn calls it in each), from FNSERVE_* settings."""
    return front(Settings())


def front(settings: Settings, service: InferenceService | None = None) -> V2App:
    """A front process's app, with its inference workers started (none with ``parallel_workers = 0``);
    ``service``: one already loaded in this process, for inference here."""
    pool = inference_pool(settings) if pooled(settings) else None
    try:
        app = build_app(settings, pool, service)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    if pool is None:
        bootstrap.pin_inference(settings)
    freeze_heap()
    return app


def pooled(settings: Settings) -> bool:
    """Whether models run in inference workers (CPU or GPU ones), not in the front process."""
    return bool(settings.parallel_workers or settings.gpu_workers)


def settings_env(settings: Settings) -> dict[str, str]:
    """What a child process (a front process, an inference worker) needs of the settings, as FNSERVE_*."""
    env = {
        "FNSERVE_MANIFEST": settings.manifest,
        "FNSERVE_PARALLEL_WORKERS": str(settings.parallel_workers),
        "FNSERVE_SERVER_PROCESSES": str(settings.server_processes),
        "FNSERVE_GPU_WORKERS": str(settings.gpu_workers),
        "FNSERVE_EAGER_LOAD": "true",
        "FNSERVE_ACCESS_LOG": "true" if settings.access_log else "false",
        "FNSERVE_MODEL_CACHE_DIR": str(settings.model_cache_dir),
        "FNSERVE_LOG_LEVEL": settings.log_level,
        "FNSERVE_METRICS": "true" if settings.metrics else "false",
    }
    if settings.intra_op_threads is not None:
        env["FNSERVE_INTRA_OP_THREADS"] = str(settings.intra_op_threads)
    if settings.gpu_capacity is not None:
        env["FNSERVE_GPU_CAPACITY"] = str(settings.gpu_capacity)
    if settings.cpu_affinity:
        env["FNSERVE_CPU_AFFINITY"] = "true"
        env[AFFINITY_DIR_ENV] = os.environ[AFFINITY_DIR_ENV]
    if settings.grpc_port is not None:
        env["FNSERVE_GRPC_PORT"] = str(settings.grpc_port)
        env["FNSERVE_GRPC_HOST"] = settings.grpc_host
    return env


def inference_pool(settings: Settings) -> Overflow:
    """The inference workers: ``parallel_workers`` of them; or ``gpu_workers`` on the GPU, filled up to
    ``gpu_capacity`` calls in flight, then overflowing to ``parallel_workers`` CPU workers. The settings they
    need cross as environment variables; CPU workers get ``FNSERVE_DEVICE=cpu`` (CPU providers alone)."""
    env = settings_env(settings)
    groups: list[tuple[str, int, dict[str, str], int | None]] = []
    if settings.gpu_workers:
        groups.append(("gpu", settings.gpu_workers, {}, settings.gpu_capacity or 2 * settings.gpu_workers))
        if settings.parallel_workers:
            groups.append(("cpu", settings.parallel_workers, {DEVICE_ENV: "cpu"}, None))
    else:
        groups.append(("workers", settings.parallel_workers, {}, None))
    started: list[Group] = []
    try:
        for device, workers, extra, capacity in groups:
            spec = FunctionSpec(
                name=f"inference-{device}",
                code_dir=os.getcwd(),
                handler="fnserve.workers.inference.handler",
                env=env | extra,
                timeout=settings.inference_timeout_seconds,
            )
            started.append(Group(device, WorkerPool(spec, workers).start(), capacity))
    except BaseException:
        for group in started:
            group.pool.close()
        raise
    return Overflow(started)


def grpc_server(settings: Settings, plane: DataPlane, telemetry: Telemetry | None = None) -> Companion:
    """The OIP gRPC service on ``settings.grpc_port``, over the HTTP app's data plane."""
    try:
        from fnserve.adapters.grpc.server import GrpcServer
    except ImportError as exc:
        raise ConfigError(f"gRPC needs fnserve[grpc] (pip install 'fnserve[grpc]'): {exc}") from None
    assert settings.grpc_port is not None
    return GrpcServer(
        plane,
        settings.grpc_host,
        settings.grpc_port,
        max_message_bytes=settings.max_request_bytes,
        grace_seconds=settings.inference_timeout_seconds,
        access_log=settings.access_log,
        shared_port=settings.server_processes > 1,
        telemetry=telemetry,
    )


def build_app(settings: Settings, pool: Overflow | None = None, service: InferenceService | None = None) -> V2App:
    """The server's app: models in ``pool``'s workers, or in this process when there is no pool (``service``,
    when they are loaded already)."""
    store = bootstrap.result_store(settings, for_requests=True)
    service = service or bootstrap.build_service(settings, store, pool)
    # Blocking calls wait in threads when there are any: models in workers, DynamoDB, SQS follow-ups.
    blocking = pool is not None or store is not None or bool(service.registry.manifest.cascades)
    plane = bootstrap.build_dataplane(settings, service=service, store=store, batching=True, offload=blocking)
    tracing.configure()
    metrics = None
    if settings.metrics:
        from fnserve.adapters.metrics import ServerMetrics

        metrics = ServerMetrics()
        metrics.watch(plane, pool)
    companions: list[Companion] = [metrics] if metrics is not None else []  # stopped last: its final flush
    if settings.grpc_port is not None:
        companions.append(grpc_server(settings, plane, metrics.telemetry("grpc") if metrics is not None else None))
    listening = fronts.all_listening()  # one of several front processes: ready once all of them listen
    if listening is not None:  # counted in last, once its gRPC server (if any) is up too
        plane.ready_when(listening)
        companions.append(listening)
    app = create_app(
        plane,
        settings,
        metrics.telemetry("http") if metrics is not None else None,
        on_shutdown=pool.close if pool is not None else None,
        companions=companions,
        metrics=metrics.render if metrics is not None else None,
    )
    app.state.plane = plane
    app.state.pool = pool
    app.fastapi()  # built now: a server's first health check should not pay for it
    return app
