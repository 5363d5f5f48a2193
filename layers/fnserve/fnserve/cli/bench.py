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


@app.command()
def bench(
    manifest: Annotated[
        Path,
        typer.Argument(
            envvar=list(MANIFEST_ENV), help="Model manifest (default FNSERVE_MANIFEST, else manifest.toml)."
        ),
    ] = DEFAULT_MANIFEST,
    model: Annotated[str | None, typer.Option("--model", help="Model or pipeline (default: the only model).")] = None,
    data: Annotated[
        Path | None, typer.Option("--data", exists=True, dir_okay=False, help="Requests' inputs: .npy or .npz.")
    ] = None,
    request: Annotated[
        list[Path] | None,
        typer.Option("--request", exists=True, dir_okay=False, help="A V2 JSON request file (repeatable)."),
    ] = None,
    rows: Annotated[int, typer.Option(min=1, help="Rows per request made from metadata or --data.")] = 1,
    p99_ms: Annotated[
        float | None,
        typer.Option(
            "--p99-ms", help="Latency budget: recommend the most throughput within it (--targets: the cheapest target)."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory for bench.json, the snippet, the plots, the profile.")] = Path(
        "fnserve-bench"
    ),
    sweep: Annotated[
        bool | None,
        typer.Option(
            help="Sweep server configurations (default: yes, unless --targets; --no-sweep: profile or size only)."
        ),
    ] = None,
    stages: Annotated[str, typer.Option(help="Sweep stages, comma-separated.")] = "layout,threads,batching",
    seconds: Annotated[float, typer.Option(min=0.2, help="Seconds of load at each concurrency level.")] = 2.0,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Highest concurrency tried.")] = 64,
    generator: Annotated[
        str,
        typer.Option(
            help="Load generator: auto (perf_analyzer, else wrk, when installed), perf_analyzer, wrk, built-in."
        ),
    ] = "auto",
    confirm_seconds: Annotated[
        float, typer.Option(min=0, help="Seconds of the confirming run of the recommendation (0: none).")
    ] = 5.0,
    floor_seconds: Annotated[
        float, typer.Option(min=0.01, help="Seconds of raw onnxruntime runs per batch size and thread count.")
    ] = 0.5,
    profile: Annotated[
        bool, typer.Option("--profile", help="Profile the recommended configuration under load with py-spy.")
    ] = False,
    profile_seconds: Annotated[float, typer.Option(min=1, help="Seconds the profile samples.")] = 10.0,
    lambda_: Annotated[
        bool, typer.Option("--lambda", help="Emulate Lambda memory sizes (CPU quotas): latency and cost per size.")
    ] = False,
    memory: Annotated[
        str, typer.Option(help="Lambda memory sizes in MB, comma-separated.")
    ] = "512,1024,1769,2048,3008",
    lambda_seconds: Annotated[float, typer.Option(min=0.1, help="Seconds of invocations per Lambda size.")] = 3.0,
    price_gb_second: Annotated[
        float, typer.Option(help="Lambda's price per GB-second (x86, us-east-1).")
    ] = prices.LAMBDA_GB_SECOND["x86_64"],
    price_per_million: Annotated[
        float, typer.Option(help="Lambda's price per million requests.")
    ] = prices.LAMBDA_PER_MILLION,
    targets: Annotated[
        bool,
        typer.Option(
            "--targets",
            help="Cost a month and p99 on each target (Lambda, SageMaker Serverless, Cloud Run, a container) at the "
            "traffic of --rps, from a request's CPU time and cold start on this machine; the cheapest first.",
        ),
    ] = False,
    rps: Annotated[float, typer.Option(min=0.000001, help="Mean requests a second (--targets).")] = 1.0,
    peak_rps: Annotated[
        float | None, typer.Option(min=0.000001, help="Peak requests a second (--targets; default: the mean).")
    ] = None,
    bytes_in: Annotated[
        int | None, typer.Option(min=0, help="Request bytes (--targets; default: the request bench sends).")
    ] = None,
    bytes_out: Annotated[
        int | None, typer.Option(min=0, help="Answer bytes (--targets; default: the answer to that request).")
    ] = None,
    cloud_run_vcpus: Annotated[float, typer.Option(min=0.08, help="Cloud Run's CPU setting (--targets).")] = 1.0,
    container_vcpus: Annotated[
        float | None,
        typer.Option(min=0.25, help="The container's vCPUs (--targets; default: the least Fargate size for the peak)."),
    ] = None,
    container_vcpu_hour: Annotated[
        float, typer.Option(help=f"The container's $ per vCPU-hour (Fargate x86, us-east-1, {prices.AS_OF}).")
    ] = prices.FARGATE_VCPU_HOUR["x86_64"],
    container_gb_hour: Annotated[
        float, typer.Option(help=f"The container's $ per GB-hour (Fargate x86, us-east-1, {prices.AS_OF}).")
    ] = prices.FARGATE_GB_HOUR["x86_64"],
) -> None:
    """Measure the raw onnxruntime floor, sweep server layouts, threads, pinning and batching under load on
    loopback, and recommend the fastest configuration; --profile writes a flame graph, --lambda sizes Lambda,
    --targets prices every target at a traffic profile."""
    from fnserve.bench.cost import Traffic
    from fnserve.bench.load import have_wrk
    from fnserve.bench.main import Options
    from fnserve.bench.main import bench as run_bench
    from fnserve.bench.perf_analyzer import have as have_perf_analyzer
    from fnserve.bench.sweep import LoadOptions
    from fnserve.bench.targets import Choices
    from fnserve.bench.tuner import STAGES

    chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    if unknown := [s for s in chosen if s not in STAGES]:
        raise fail(f"unknown --stages {unknown}; they are {', '.join(STAGES)}")
    if generator not in ("auto", "perf_analyzer", "wrk", "built-in"):
        raise fail(f"--generator is auto, perf_analyzer, wrk or built-in, not {generator!r}")
    if generator == "wrk" and not have_wrk():
        raise fail("--generator wrk: wrk is not installed")
    if generator == "perf_analyzer" and not have_perf_analyzer():
        raise fail("--generator perf_analyzer: perf_analyzer is not installed (make perf-analyzer sets it up)")
    try:
        sizes = tuple(int(m) for m in memory.split(",") if m.strip()) if lambda_ else ()
    except ValueError:
        raise fail(f"--memory takes sizes in MB separated by commas, not {memory!r}") from None
    if any(not 128 <= m <= 10240 for m in sizes):
        raise fail("Lambda memory sizes are 128 to 10240 MB")
    options = Options(
        manifest=manifest,
        model=model,
        data=data,
        request_files=tuple(request or ()),
        rows=rows,
        p99_ms=p99_ms,
        out=out,
        sweep=sweep if sweep is not None else not targets,
        stages=chosen,
        load=LoadOptions(seconds=seconds, max_concurrency=max_concurrency, generator=generator),
        confirm_seconds=confirm_seconds,
        floor_seconds=floor_seconds,
        profile=profile,
        profile_seconds=profile_seconds,
        lambda_sizes=sizes,
        lambda_seconds=lambda_seconds,
        price_gb_second=price_gb_second,
        price_per_million=price_per_million,
        targets=Traffic(
            rps,
            peak_rps,
            bytes_in,
            bytes_out,
            Choices(
                lambda_gb_second_x86=price_gb_second,
                lambda_per_million=price_per_million,
                container_vcpu_hour=container_vcpu_hour,
                container_gb_hour=container_gb_hour,
                cloud_run_vcpus=cloud_run_vcpus,
                container_vcpus=container_vcpus,
            ),
        )
        if targets
        else None,
    )
    if targets and peak_rps is not None and peak_rps < rps:
        raise fail(f"--peak-rps {peak_rps:g} is below the mean, --rps {rps:g}")
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
