"""The long-running server: one front process under uvicorn, and a pool of inference workers.

The front process parses HTTP, validates, caches, batches and runs cascades; with
``parallel_workers >= 1`` the models live in that many worker processes (spawned, warm, see
:mod:`fnserve.workers.remote`), so inference runs in parallel beside the event loop. With
``parallel_workers = 0`` inference runs in the front process itself: no inter-process hop,
which is the better choice for models so small that the hop costs more than the model
(``make bench`` shows where that line is).

Given neither (no ``--workers``, ``--processes`` or their variables), :func:`fnserve.server.layout.choose_layout`
decides at start, from the loaded models; with ``fast_start``, :func:`fnserve.server.layout.untimed_layout`, before
any model is loaded (the front processes load them: this process first, serving alone until the others join).

A child that cannot start stops the server with its error, within seconds: an inference worker at the start, or
:data:`~fnserve.server.fronts.START_ATTEMPTS` replacements of one in a row later; a front process as
:func:`fnserve.server.fronts.run` says. One that dies after it served is replaced.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fnserve.core.errors import ConfigError
from fnserve.core.host import AFFINITY_DIR_ENV, available_cpus
from fnserve.core.models.manifest.groups import WorkerGroup
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.observability.logs import logger
from fnserve.server import fronts, rundirs
from fnserve.server.layout import Layout, pin_inference, untimed_layout
from fnserve.server.starting import not_ready_until_loaded, refuse_taken
from fnserve.settings import Settings

# The process that supervises front processes imports what it runs: the app, the data plane and onnxruntime are
# the front processes' (a fast start spawns them sooner for it).
if TYPE_CHECKING:
    from fnserve.adapters.http.infer import V2App
    from fnserve.core.execution.service import InferenceService
    from fnserve.workers.pool import FunctionSpec, WorkerPool
    from fnserve.workers.remote import Overflow, Pools


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_ready: Callable[[InferenceService | None, Settings], None] | None = None,
) -> None:
    """Load every model (in the workers, or here with no workers; in the front processes alone with
    ``fast_start``), then serve until SIGINT or SIGTERM.

    On a signal, requests in flight finish, then the workers stop (the app's lifespan). The
    workers ignore signals themselves, and exit on their own if this process is killed
    outright (their pipe to it closes). With ``server_processes > 1``, that many front processes serve the
    port (:mod:`fnserve.server.fronts`), each building its own app (:func:`app_factory`).
    """
    rundirs.sweep()  # what servers killed outright left behind (their statistics take memory in /dev/shm)
    made = rundirs.RunDirs()
    if settings.metrics and not os.environ.get(MULTIPROC_ENV):  # else the directory is the user's
        # Before any process imports prometheus-client (it reads the variable then). Its files are mmap'd:
        # written in memory, not replaced, so a disk's temporary directory, not a tmpfs a full one of which
        # would be a SIGBUS.
        made.publish(MULTIPROC_ENV, "fnserve-metrics-")
    # Where several front processes add up each other's statistics (server_app shares them): files
    # replaced 10 times a second each, in memory where the system has a tmpfs for that (cheaper than a disk's).
    made.publish(fronts.STATISTICS_DIR_ENV, "fnserve-stats-", rundirs.memory_parent())
    if settings.cpu_affinity:  # the slot locks of the processes pinned to CPUs (pin_inference)
        made.publish(AFFINITY_DIR_ENV, "fnserve-cpus-")
    try:
        _serve(settings, host, port, on_ready)
    finally:
        made.remove()


def _serve(
    settings: Settings, host: str, port: int, on_ready: Callable[[InferenceService | None, Settings], None] | None
) -> None:
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        "http": "fnserve.adapters.http.protocol:HttpProtocol",  # httptools, a response in one send
        "access_log": False,  # fnserve writes its own (--access-log)
        "log_level": "warning",
        "server_header": False,  # no "server: uvicorn" on every answer
        "ws": "none",  # no route takes a WebSocket: uvicorn then imports no websockets library at start
    }
    if "grpc_host" not in settings.fields_set:
        settings = settings.replace(grpc_host=host)  # gRPC listens where HTTP does, unless told
    _say_who_may_call(settings, host)
    if settings.grpc_port is not None:  # refused here, before any model loads, not shared through SO_REUSEPORT
        refuse_taken(settings.grpc_host, settings.grpc_port, "gRPC")
    with not_ready_until_loaded(host, port, settings.answer_while_loading) as starting:
        settings, app = _load(settings, on_ready)
        if app is None and settings.fast_start and fronts.balanced():
            # This process serves first, so the first answer waits for no second interpreter; the others join.
            listening = fronts.become_first_front(starting.close)
            app = front(settings)
            try:
                fronts.serve_first(
                    app,
                    f"{__name__}:app_factory",
                    settings.server_processes,
                    options,
                    listening,
                    _front_respawns(settings),
                    on_listening=starting.close,
                    at_first_answer=app.at_first_answer.append,
                )
            finally:
                if app.state.pool is not None:
                    app.state.pool.close()
            return
        if app is None:  # the front processes join the port while it answers 503; it stops once they all listen
            fronts.run(
                f"{__name__}:app_factory",
                settings.server_processes,
                options,
                _front_respawns(settings),
                on_listening=starting.close,
            )
            return
    try:
        fronts.serve(app, options)
    finally:
        if app.state.pool is not None:  # the lifespan closed it already, unless uvicorn never started
            app.state.pool.close()


def _say_who_may_call(settings: Settings, host: str) -> None:
    """The start log's line on callers: the keys' source and ids, or that anyone who reaches the port is answered.
    Keys that cannot be read stop the start here, before any model loads."""
    from fnserve.adapters.keys import api_keys

    keys = api_keys(settings)
    if keys is None:
        logger.warning(
            f"no API key set (FNSERVE_API_KEYS, FNSERVE_API_KEYS_FILE or FNSERVE_API_KEYS_SECRET): this server "
            f"answers anyone who can reach {host}",
            extra={"api_keys": 0},
        )
        return
    logger.info(
        f"API keys required on every route but the health checks; {len(keys.ids)} key(s) from {keys.source}",
        extra={"api_keys": len(keys.ids), "api_key_ids": keys.ids},
    )


def _load(
    settings: Settings, on_ready: Callable[[InferenceService | None, Settings], None] | None
) -> tuple[Settings, V2App | None]:
    """Every model loaded, and the layout chosen: the one front process's app, or None (and the settings the
    front processes get) when several serve the port, each building its own."""
    settings = settings.replace(eager_load=True)
    if "://" in settings.manifest:  # fetched once here, the front processes reading the copy
        from fnserve import bootstrap

        settings = bootstrap.with_local_manifest(settings)
    groups = load_manifest(settings.manifest).groups
    if groups:
        settings = _placed(settings, groups)
    elif settings.gpu_workers and "parallel_workers" not in settings.fields_set:
        # GPU workers alone, unless CPU workers to overflow to are asked for.
        settings = settings.replace(parallel_workers=0)
    auto = not groups and not {"parallel_workers", "server_processes", "gpu_workers"} & settings.fields_set
    if auto and settings.fast_start:  # no model loaded here: the front processes load them, once each
        settings, auto = _laid_out(settings, untimed_layout(available_cpus(), settings.intra_op_threads)), False
    checked: InferenceService | None = None
    if auto or (settings.server_processes > 1 and not settings.fast_start):
        from fnserve import bootstrap
        from fnserve.server.layout import choose_layout

        # Every model is loaded here once: one that cannot load stops the start with its reason,
        # instead of uvicorn's supervisor restarting front processes that cannot start.
        checked = bootstrap.build_service(settings, bootstrap.result_store(settings, for_requests=True))
        if auto:
            settings = _laid_out(settings, choose_layout(checked, available_cpus(), settings.intra_op_threads))
    if settings.server_processes > 1:
        if on_ready is not None:
            on_ready(checked, settings)
        del checked
        os.environ.update(children_env(settings))  # how the settings reach the front processes
        return settings, None
    # One front process: running inference itself, it serves the models loaded (and timed) above.
    loaded = checked if not pooled(settings) and not groups else None
    del checked
    app = front(settings, loaded, groups)
    if on_ready is not None:
        try:
            on_ready(app.state.plane.service, settings)
        except BaseException:
            if app.state.pool is not None:
                app.state.pool.close()
            raise
    return settings, app


def _laid_out(settings: Settings, layout: Layout) -> Settings:
    """The settings of a chosen layout, which the start log gives with its reason."""
    logger.info(
        f"serving layout: {layout.processes} front process(es), {layout.workers} inference worker(s) each: "
        f"{layout.why}",
        extra={
            "processes": layout.processes,
            "workers": layout.workers,
            "batch1_ms": {name: round(ms, 4) for name, ms in layout.batch1_ms.items()},
        },
    )
    return settings.replace(server_processes=layout.processes, parallel_workers=layout.workers)


def _placed(settings: Settings, groups: list[WorkerGroup]) -> Settings:
    """The layout of a manifest with worker groups: one front process, running the models in no group, and each
    group's workers. A group's workers serve every request of its models, so more front processes would each
    start their own: memory would grow with them, which groups are there to prevent."""
    asked = {"parallel_workers", "server_processes", "gpu_workers"} & settings.fields_set
    if asked and (settings.server_processes > 1 or settings.parallel_workers or settings.gpu_workers):
        raise ConfigError(
            "the manifest places models in worker groups ([[groups]]), which name their own workers: leave out "
            "--processes, --workers and --gpu-workers (and FNSERVE_SERVER_PROCESSES, FNSERVE_PARALLEL_WORKERS, "
            "FNSERVE_GPU_WORKERS)"
        )
    update: dict[str, Any] = {"server_processes": 1, "parallel_workers": 0}
    if settings.intra_op_threads is None:  # the CPUs shared by every process that runs models
        update["intra_op_threads"] = max(1, available_cpus() // (sum(g.workers for g in groups) + 1))
    placed = "; ".join(f"{g.name!r}: {g.workers} worker(s) holding {', '.join(g.models)}" for g in groups)
    logger.info(
        f"serving layout: 1 front process running the models in no worker group; worker groups {placed}",
        extra={"groups": {g.name: {"workers": g.workers, "models": g.models} for g in groups}},
    )
    return settings.replace(**update)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _front_respawns(settings: Settings) -> Callable[[], None] | None:
    """What counts the front processes replaced, in this supervising process (none without metrics)."""
    if not settings.metrics:
        return None
    from fnserve.observability.metrics import front_respawns

    return front_respawns()


def app_factory() -> V2App:
    """One front process of a multi-process server (uvicorn calls it in each), from FNSERVE_* settings."""
    return front(Settings())


def front(
    settings: Settings, service: InferenceService | None = None, groups: list[WorkerGroup] | None = None
) -> V2App:
    """A front process's app, with its inference workers started (none with ``parallel_workers = 0``);
    ``service``: one already loaded in this process, for inference here; ``groups``: the manifest's worker groups
    (a server with groups has this one front process)."""
    from fnserve.core.host import freeze_heap
    from fnserve.server.app import server_app

    pool: Overflow | Pools | None = None
    if groups:
        pool = group_pools(settings, groups)
    elif pooled(settings):
        pool = inference_pool(settings)
    try:
        app = server_app(settings, pool, service)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    if pool is None:
        pin_inference(settings)
    # Once the first request is answered (a full collection first, which a cold start's first answer need not wait
    # for); the app's FastAPI, built just before, is frozen with the rest.
    app.after_first_answer.append(freeze_heap)
    return app


def pooled(settings: Settings) -> bool:
    """Whether models run in inference workers (CPU or GPU ones), not in the front process."""
    return bool(settings.parallel_workers or settings.gpu_workers)


def children_env(settings: Settings) -> dict[str, str]:
    """What a child process (a front process, an inference worker) is given: the settings whole (every model
    loaded at its start), and the directory of CPU slot locks its processes share."""
    env = settings.replace(eager_load=True).to_env()
    if settings.cpu_affinity:
        env[AFFINITY_DIR_ENV] = os.environ[AFFINITY_DIR_ENV]
    return env


def group_pools(settings: Settings, groups: list[WorkerGroup]) -> Pools:
    """Each worker group's workers, loading the group's models alone (``worker_group``), started together."""
    from fnserve.workers.remote import Group, Overflow, Pools

    started: dict[str, Overflow] = {}
    try:
        for group in groups:
            spec = _inference_spec(group.name, children_env(settings.replace(worker_group=group.name)), settings)
            started[group.name] = Overflow([Group(group.name, _pool(spec, group.workers).start())])
    except BaseException:
        for pool in started.values():
            pool.close()
        raise
    return Pools(started)


def _inference_spec(name: str, env: dict[str, str], settings: Settings) -> FunctionSpec:
    """An inference worker of ``fnserve serve``: the settings ``env`` gives it, the server's inference timeout."""
    from fnserve.workers.pool import FunctionSpec

    return FunctionSpec(
        name=f"inference-{name}",
        code_dir=os.getcwd(),
        handler="fnserve.server.inference.handler",
        env=env,
        timeout=settings.inference_timeout_seconds,
    )


def _pool(spec: FunctionSpec, workers: int) -> WorkerPool:
    """Inference workers that stop the server when, once started, a replacement cannot start a few times in a row:
    its models cannot load any more (a file changed, a device gone), and a server retrying for ever is never
    whole again, where a fresh start reports why."""
    from fnserve.workers.pool import WorkerPool

    return WorkerPool(spec, workers, attempts=fronts.START_ATTEMPTS, on_give_up=fronts.fail)


def inference_pool(settings: Settings) -> Overflow:
    """The inference workers: ``parallel_workers`` of them; or ``gpu_workers`` on the GPU, filled up to
    ``gpu_capacity`` calls in flight, then overflowing to ``parallel_workers`` CPU workers. The settings they
    cross whole (:meth:`~fnserve.settings.EnvSettings.to_env`); CPU workers' say ``device = "cpu"`` (CPU providers
    alone)."""
    from fnserve.workers.remote import Group, Overflow

    cpu = settings.replace(device="cpu")
    groups: list[tuple[str, int, dict[str, str], int | None]] = []
    if settings.gpu_workers:
        groups.append(
            ("gpu", settings.gpu_workers, children_env(settings), settings.gpu_capacity or 2 * settings.gpu_workers)
        )
        if settings.parallel_workers:
            groups.append(("cpu", settings.parallel_workers, children_env(cpu), None))
    else:
        groups.append(("workers", settings.parallel_workers, children_env(settings), None))
    started: list[Group] = []
    try:
        for device, workers, env, capacity in groups:
            started.append(Group(device, _pool(_inference_spec(device, env, settings), workers).start(), capacity))
    except BaseException:
        for group in started:
            group.pool.close()
        raise
    return Overflow(started)
