"""``fnserve bench`` (a server's layout, Lambda's sizes and the targets' prices, measured) and ``fnserve cascade
tune`` (a cascade's threshold, scored on labelled data)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fnserve.bench import prices
from fnserve.cli.root import ManifestOpt, app, cascade_app, fail
from fnserve.core.errors import FnserveError
from fnserve.server.command import DEFAULT_MANIFEST, MANIFEST_ENV

# bench's options, one alias each, so that the command reads as its parse and its call.
_Manifest = Annotated[
    Path,
    typer.Argument(envvar=list(MANIFEST_ENV), help="Model manifest (default FNSERVE_MANIFEST, else manifest.toml)."),
]
_Model = Annotated[str | None, typer.Option("--model", help="Model or pipeline (default: the only model).")]
_Data = Annotated[
    Path | None, typer.Option("--data", exists=True, dir_okay=False, help="Requests' inputs: .npy or .npz.")
]
_Requests = Annotated[
    list[Path] | None,
    typer.Option("--request", exists=True, dir_okay=False, help="A V2 JSON request file (repeatable)."),
]
_Rows = Annotated[int, typer.Option(min=1, help="Rows per request made from metadata or --data.")]
_P99 = Annotated[
    float | None,
    typer.Option(
        "--p99-ms", help="Latency budget: recommend the most throughput within it (--targets: the cheapest target)."
    ),
]
_Out = Annotated[Path, typer.Option(help="Directory for bench.json, the snippet, the plots, the profile.")]
_Sweep = Annotated[
    bool | None,
    typer.Option(
        help="Sweep server configurations (default: yes, unless --targets; --no-sweep: profile or size only)."
    ),
]
_Stages = Annotated[str, typer.Option(help="Sweep stages, comma-separated.")]
_Seconds = Annotated[float, typer.Option(min=0.2, help="Seconds of load at each concurrency level.")]
_MaxConcurrency = Annotated[int, typer.Option(min=1, help="Highest concurrency tried.")]
_Generator = Annotated[
    str,
    typer.Option(help="Load generator: auto (perf_analyzer, else wrk, when installed), perf_analyzer, wrk, built-in."),
]
_Confirm = Annotated[float, typer.Option(min=0, help="Seconds of the confirming run of the recommendation (0: none).")]
_Floor = Annotated[
    float, typer.Option(min=0.01, help="Seconds of raw onnxruntime runs per batch size and thread count.")
]
_Profile = Annotated[
    bool, typer.Option("--profile", help="Profile the recommended configuration under load with py-spy.")
]
_ProfileSeconds = Annotated[float, typer.Option(min=1, help="Seconds the profile samples.")]
_Lambda = Annotated[
    bool, typer.Option("--lambda", help="Emulate Lambda memory sizes (CPU quotas): latency and cost per size.")
]
_Memory = Annotated[str, typer.Option(help="Lambda memory sizes in MB, comma-separated.")]
_LambdaSeconds = Annotated[float, typer.Option(min=0.1, help="Seconds of invocations per Lambda size.")]
_GbSecond = Annotated[float, typer.Option(help="Lambda's price per GB-second (x86, us-east-1).")]
_PerMillion = Annotated[float, typer.Option(help="Lambda's price per million requests.")]
_Targets = Annotated[
    bool,
    typer.Option(
        "--targets",
        help="Cost a month and p99 on each target (Lambda, SageMaker Serverless, Cloud Run, a container) at the "
        "traffic of --rps, from a request's CPU time and cold start on this machine; the cheapest first.",
    ),
]
_Rps = Annotated[float, typer.Option(min=0.000001, help="Mean requests a second (--targets).")]
_PeakRps = Annotated[
    float | None, typer.Option(min=0.000001, help="Peak requests a second (--targets; default: the mean).")
]
_BytesIn = Annotated[
    int | None, typer.Option(min=0, help="Request bytes (--targets; default: the request bench sends).")
]
_BytesOut = Annotated[
    int | None, typer.Option(min=0, help="Answer bytes (--targets; default: the answer to that request).")
]
_CloudRunVcpus = Annotated[float, typer.Option(min=0.08, help="Cloud Run's CPU setting (--targets).")]
_FrontDoor = Annotated[
    str,
    typer.Option(
        help="--targets: the front door priced before every target, the same kind for each: own (a Lambda function "
        "URL, SageMaker's InvokeEndpoint, Cloud Run's URL, an ALB before the container) or api (HTTP API before "
        "Lambda and the container, a REST API before SageMaker, Google's API Gateway before Cloud Run).",
    ),
]
_SagemakerStart = Annotated[
    float,
    typer.Option(min=0, help="--targets: SageMaker Serverless's container start, added to its cold start (ms)."),
]
_ContainerVcpus = Annotated[
    float | None,
    typer.Option(min=0.25, help="The container's vCPUs (--targets; default: the least Fargate size for the peak)."),
]
_VcpuHour = Annotated[
    float, typer.Option(help=f"The container's $ per vCPU-hour (Fargate x86, us-east-1, {prices.AS_OF}).")
]
_GbHour = Annotated[
    float, typer.Option(help=f"The container's $ per GB-hour (Fargate x86, us-east-1, {prices.AS_OF}).")
]


@app.command()
def bench(
    manifest: _Manifest = DEFAULT_MANIFEST,
    model: _Model = None,
    data: _Data = None,
    request: _Requests = None,
    rows: _Rows = 1,
    p99_ms: _P99 = None,
    out: _Out = Path("fnserve-bench"),
    sweep: _Sweep = None,
    stages: _Stages = "layout,threads,batching",
    seconds: _Seconds = 2.0,
    max_concurrency: _MaxConcurrency = 64,
    generator: _Generator = "auto",
    confirm_seconds: _Confirm = 5.0,
    floor_seconds: _Floor = 0.5,
    profile: _Profile = False,
    profile_seconds: _ProfileSeconds = 10.0,
    lambda_: _Lambda = False,
    memory: _Memory = "512,1024,1769,2048,3008",
    lambda_seconds: _LambdaSeconds = 3.0,
    price_gb_second: _GbSecond = prices.LAMBDA_GB_SECOND["x86_64"],
    price_per_million: _PerMillion = prices.LAMBDA_PER_MILLION,
    targets: _Targets = False,
    rps: _Rps = 1.0,
    peak_rps: _PeakRps = None,
    bytes_in: _BytesIn = None,
    bytes_out: _BytesOut = None,
    cloud_run_vcpus: _CloudRunVcpus = 1.0,
    container_vcpus: _ContainerVcpus = None,
    container_vcpu_hour: _VcpuHour = prices.FARGATE_VCPU_HOUR["x86_64"],
    container_gb_hour: _GbHour = prices.FARGATE_GB_HOUR["x86_64"],
    front_door: _FrontDoor = "own",
    sagemaker_start_ms: _SagemakerStart = 0.0,
) -> None:
    """Measure the raw onnxruntime floor, sweep server layouts, threads, pinning and batching under load on
    loopback, and recommend the fastest configuration; --profile writes a flame graph, --lambda sizes Lambda,
    --targets prices every target at a traffic profile."""
    from fnserve.bench.cost import Traffic
    from fnserve.bench.main import Options
    from fnserve.bench.main import bench as run_bench
    from fnserve.bench.sweep import LoadOptions
    from fnserve.bench.targets import FRONT_DOORS, Choices

    try:
        sizes = tuple(int(m) for m in memory.split(",") if m.strip()) if lambda_ else ()
    except ValueError:
        raise fail(f"--memory takes sizes in MB separated by commas, not {memory!r}") from None
    if front_door not in FRONT_DOORS:
        raise fail(f"--front-door takes one of {', '.join(FRONT_DOORS)}, not {front_door!r}")
    prices_ = Choices(
        lambda_gb_second_x86=price_gb_second,
        lambda_per_million=price_per_million,
        container_vcpu_hour=container_vcpu_hour,
        container_gb_hour=container_gb_hour,
        cloud_run_vcpus=cloud_run_vcpus,
        container_vcpus=container_vcpus,
        front_door=front_door,
        sagemaker_start_ms=sagemaker_start_ms,
    )
    options = Options(
        manifest=manifest,
        model=model,
        data=data,
        request_files=tuple(request or ()),
        rows=rows,
        p99_ms=p99_ms,
        out=out,
        sweep=sweep if sweep is not None else not targets,
        stages=tuple(s.strip() for s in stages.split(",") if s.strip()),
        load=LoadOptions(seconds=seconds, max_concurrency=max_concurrency, generator=generator),
        confirm_seconds=confirm_seconds,
        floor_seconds=floor_seconds,
        profile=profile,
        profile_seconds=profile_seconds,
        lambda_sizes=sizes,
        lambda_seconds=lambda_seconds,
        price_gb_second=price_gb_second,
        price_per_million=price_per_million,
        targets=Traffic(rps, peak_rps, bytes_in, bytes_out, prices_) if targets else None,
    )
    try:
        run_bench(options)
    except FnserveError as exc:
        raise fail(exc.message) from None


@cascade_app.command("tune")
def cascade_tune(
    cascade: Annotated[str, typer.Argument(help="Cascade name in the manifest.")],
    data: Annotated[Path, typer.Option("--data", exists=True, help="Labelled validation data (.npz).")],
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    target_accuracy: Annotated[float | None, typer.Option(help="Recommend the threshold reaching this.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of accuracy against slow-model share.")] = None,
) -> None:
    """Score thresholds on labelled data: slow-model share skipped, and combined accuracy."""
    from fnserve.core.codec.datafiles import read_data
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.jobs import tuning

    try:
        service = InferenceService.from_manifest(manifest)
        settings = {c.name: c for c in service.registry.manifest.cascades}.get(cascade)
        if settings is None:
            raise fail(f"no cascade {cascade!r} in {manifest}")
        names = [spec["name"] for spec in service.model_metadata(settings.fast, settings.fast_version)["inputs"]]
        result = tuning.tune(service, settings, read_data(data, names))
    except FnserveError as exc:
        raise fail(exc.message) from None
    recommended = result.recommend(target_accuracy) if target_accuracy is not None else None
    typer.echo(
        f"cascade {cascade}: {settings.fast} alone {result.fast_accuracy:.4f}, {settings.slow} alone "
        f"{result.slow_accuracy:.4f}; rule {settings.rule} on {settings.output} ({settings.scores})"
    )
    for line in tuning.table(result, recommended):
        typer.echo(line)
    if target_accuracy is not None:
        if recommended is None:
            typer.echo(f"no threshold reaches accuracy {target_accuracy:g}")
        else:
            typer.echo(
                f"recommended threshold {recommended.threshold:g}: accuracy {recommended.accuracy:.4f}, "
                f"slow model skipped for {recommended.skip_share:.1%} of requests"
            )
    if plot is not None:
        tuning.plot(result, settings, plot, target_accuracy)
        typer.echo(f"wrote {plot}")
