"""``fnserve serve``: its options parsed, then :func:`fnserve.server.command.serve` called (a bare ``fnserve serve``
skips this module, its options read from the environment: :mod:`fnserve.entry`)."""

from __future__ import annotations

from typing import Annotated

import typer

from fnserve.cli.root import ManifestOpt, app, fail
from fnserve.core.errors import FnserveError
from fnserve.server.command import DEFAULT_HOST, DEFAULT_MANIFEST, DEFAULT_PORT, HOST_ENV, PORT_ENV, ServeOptions

# serve's options, one alias each, so that the command reads as its parse and its call.
_Host = Annotated[str, typer.Option(help="Address to listen on.", envvar=list(HOST_ENV))]
_Port = Annotated[
    int,
    typer.Option(
        help="Port to listen on; else FNSERVE_PORT, else PORT (what Cloud Run and Knative give a container).",
        envvar=list(PORT_ENV),
    ),
]
_Workers = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Inference worker processes, each with every model (default FNSERVE_PARALLEL_WORKERS, or "
        "SageMaker's SAGEMAKER_MODEL_SERVER_WORKERS); 0 runs inference in the server process, best for tiny "
        "models. Without this and --processes, the layout is chosen at start from the models' batch-1 time, "
        "and the log says why. With --gpu-workers: CPU workers that take the GPU's overflow.",
    ),
]
_GpuWorkers = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Inference workers on the GPU, each model on its manifest providers (default FNSERVE_GPU_WORKERS).",
    ),
]
_GpuCapacity = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Calls in flight on the GPU workers before calls overflow to the --workers CPU workers "
        "(default FNSERVE_GPU_CAPACITY, else two per GPU worker).",
    ),
]
_Processes = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Front processes sharing the port, each with its own workers (default FNSERVE_SERVER_PROCESSES, "
        "else 1 when --workers is given); more than one pays for tiny models, whose cost is HTTP and JSON.",
    ),
]
_GrpcPort = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=65535,
        help="Also serve the Open Inference Protocol over gRPC on this port (default FNSERVE_GRPC_PORT; "
        "off when unset). Needs fnserve[grpc].",
    ),
]
_FastStart = Annotated[
    bool,
    typer.Option(
        "--fast-start",
        help="Start to the first answer fast, for platforms that scale to zero: one front process per CPU "
        "unless --processes/--workers say, no layout timed at start (default FNSERVE_FAST_START).",
    ),
]
_CpuAffinity = Annotated[
    bool,
    typer.Option(
        "--cpu-affinity",
        help="Pin each process running inference to its share of the CPUs (default FNSERVE_CPU_AFFINITY).",
    ),
]
_AccessLog = Annotated[
    bool, typer.Option("--access-log", help="One structured log line per request (costly at high rates).")
]


@app.command()
def serve(
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    host: _Host = DEFAULT_HOST,
    port: _Port = DEFAULT_PORT,
    workers: _Workers = None,
    gpu_workers: _GpuWorkers = None,
    gpu_capacity: _GpuCapacity = None,
    processes: _Processes = None,
    grpc_port: _GrpcPort = None,
    fast_start: _FastStart = False,
    cpu_affinity: _CpuAffinity = False,
    access_log: _AccessLog = False,
) -> None:
    """Serve the manifest's models over the V2 HTTP API (uvicorn), and gRPC with --grpc-port, as in a container."""
    from fnserve.server.command import serve as run

    options = ServeOptions(
        manifest,
        host,
        port,
        workers,
        gpu_workers,
        gpu_capacity,
        processes,
        grpc_port,
        fast_start,
        cpu_affinity,
        access_log,
    )
    try:
        run(options, echo=typer.echo)
    except FnserveError as exc:
        raise fail(exc.message) from None
