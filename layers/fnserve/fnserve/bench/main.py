"""``fnserve bench``, end to end: the requests, the sweep, the profile, the Lambda sizes; shown and written."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fnserve.bench import cost, prices, sizing, targets
from fnserve.bench import requests as made
from fnserve.bench.load import have_wrk, wrk_script
from fnserve.bench.perf_analyzer import have as have_perf_analyzer
from fnserve.bench.profile import profile
from fnserve.bench.report import summary, table, write
from fnserve.bench.sweep import Config, LoadOptions
from fnserve.bench.tuner import STAGES, Plan, resolve
from fnserve.bench.tuner import run as run_sweep
from fnserve.core.errors import ConfigError, InvalidInput
from fnserve.core.execution.service import InferenceService
from fnserve.core.host import available_cpus

if TYPE_CHECKING:
    from rich.console import Console

WRK_SCRIPT = "requests.lua"


@dataclass(frozen=True)
class Options:
    manifest: Path
    model: str | None = None
    data: Path | None = None
    request_files: tuple[Path, ...] = ()
    rows: int = 1
    p99_ms: float | None = None
    out: Path = Path("fnserve-bench")
    sweep: bool = True
    stages: tuple[str, ...] = ("layout", "threads", "batching")
    load: LoadOptions = LoadOptions()
    confirm_seconds: float = 5.0
    floor_seconds: float = 0.5
    profile: bool = False
    profile_seconds: float = 10.0
    lambda_sizes: tuple[int, ...] = ()
    lambda_seconds: float = 3.0
    price_gb_second: float = prices.LAMBDA_GB_SECOND["x86_64"]
    price_per_million: float = prices.LAMBDA_PER_MILLION
    targets: cost.Traffic | None = None  # --targets: every target costed at this traffic

    def check(self) -> None:
        """The ConfigError of an option this machine or bench cannot honour, before anything runs."""
        if unknown := [s for s in self.stages if s not in STAGES]:
            raise ConfigError(f"unknown --stages {unknown}; they are {', '.join(STAGES)}")
        generator = self.load.generator
        if generator not in ("auto", "perf_analyzer", "wrk", "built-in"):
            raise ConfigError(f"--generator is auto, perf_analyzer, wrk or built-in, not {generator!r}")
        if generator == "wrk" and not have_wrk():
            raise ConfigError("--generator wrk: wrk is not installed")
        if generator == "perf_analyzer" and not have_perf_analyzer():
            raise ConfigError(
                "--generator perf_analyzer: perf_analyzer is not installed (make perf-analyzer sets it up)"
            )
        if any(not 128 <= m <= 10240 for m in self.lambda_sizes):
            raise ConfigError("Lambda memory sizes are 128 to 10240 MB")
        traffic = self.targets
        if traffic is not None and traffic.peak_rps is not None and traffic.peak_rps < traffic.rps:
            raise ConfigError(f"--peak-rps {traffic.peak_rps:g} is below the mean, --rps {traffic.rps:g}")


def bench(options: Options) -> list[Path]:
    """Run what ``options`` asks for, print it, and write its files; the files written."""
    options.check()
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console()
    service = InferenceService.from_manifest(options.manifest)
    target = resolve(service, options.model)
    requests = _requests(options, target)
    written: list[Path] = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("starting")

        def progress(what: str) -> None:
            bar.update(task, description=what)

        config, concurrency = Config(), 8
        if options.sweep:
            plan = Plan(
                options.manifest,
                target.name,
                requests,
                options.p99_ms,
                options.stages,
                options.load,
                floor_seconds=options.floor_seconds,
                confirm_seconds=options.confirm_seconds,
            )
            report = run_sweep(plan, target, progress)
            bar.stop()
            console.print(table(report))
            console.print(summary(report, options.manifest), highlight=False, markup=False)
            written += write(report, options.manifest, options.out)
            if all(r.headers.get("Content-Type") == "application/json" for r in requests):
                script = options.out / WRK_SCRIPT  # the same requests, for a run of wrk by hand
                script.write_text(wrk_script([r.body for r in requests]))
                written.append(script)
            if report.recommended is not None and (point := report.recommended_point()) is not None:
                config, concurrency = report.recommended.config, point.concurrency
            bar.start()
        if options.profile:
            progress(f"profiling {config.label()} at concurrency {concurrency} with py-spy")
            found = profile(
                options.manifest,
                target.name,
                config,
                requests,
                concurrency=concurrency,
                seconds=options.profile_seconds,
                out=options.out,
            )
            bar.stop()
            console.print(
                f"\nprofile of {config.label()} at concurrency {concurrency}: {found.point.rate:,.0f} req/s, "
                f"p50 {found.point.p50:.2f} ms (under py-spy, which takes CPU itself); mean Server-Timing stages per "
                "answer:",
                highlight=False,
            )
            for stage, ms, share in found.split():
                console.print(f"  {stage:<8} {ms:8.3f} ms  {share:6.1%}", highlight=False)
            if found.speedscope is not None:
                console.print(f"flame graph: {found.speedscope} (open in https://www.speedscope.app)")
                written.append(found.speedscope)
            else:
                console.print(f"no flame graph: {found.missing}")
            bar.start()
        if options.lambda_sizes:
            sizes = sizing.measure(
                options.manifest,
                target.name,
                requests[0],
                options.lambda_sizes,
                machine_cpus=available_cpus(),
                seconds=options.lambda_seconds,
                price_gb_second=options.price_gb_second,
                price_per_million=options.price_per_million,
                progress=progress,
            )
            bar.stop()
            written += _show_sizes(console, sizes, options)
            bar.start()
        if options.targets is not None:
            costed = _measure_for_targets(options, service, target, requests[0], progress)
            bar.stop()
            written += _show_costs(console, costed, options, target.name)
    for path in written:
        console.print(f"wrote {path}")
    return written


def _requests(options: Options, target: made.Target) -> list[made.Request]:
    if options.request_files:
        return made.from_files(target, options.request_files)
    if options.data is not None:
        return made.from_data(target, options.data, options.rows)
    if options.rows < 1:
        raise InvalidInput("--rows must be at least 1")
    return made.synthetic(target, options.rows)


def _measure_for_targets(
    options: Options,
    service: InferenceService,
    target: made.Target,
    request: made.Request,
    progress: Callable[[str], None],
) -> tuple[targets.Measured, targets.Profile] | str:
    assert options.targets is not None
    progress(f"a request's time and the cold start at one vCPU (the Lambda handler at {sizing.FULL_VCPU_MB} MB)")
    measured = cost.measure(
        options.manifest,
        target.name,
        request,
        machine_cpus=available_cpus(),
        seconds=options.lambda_seconds,
        progress=progress,
    )
    if isinstance(measured, str):
        return f"{measured}: no target can be costed without a request's time at one vCPU"
    answer = cost.answer_bytes(service, target.name, request)
    return measured, cost.profile(options.targets, options.p99_ms, len(request.body), answer)


def _show_costs(
    console: Console, costed: tuple[targets.Measured, targets.Profile] | str, options: Options, name: str
) -> list[Path]:
    assert options.targets is not None
    if isinstance(costed, str):
        console.print(costed)
        return []
    measured, at = costed
    return cost.run(console, measured, at, options.targets.choices, options.out, name)


def _show_sizes(console: Console, sizes: Sequence[sizing.Size] | str, options: Options) -> list[Path]:
    import json
    from dataclasses import asdict

    from rich.table import Table

    if isinstance(sizes, str):
        console.print(sizes)
        return []
    out = Table(title="Lambda sizes (CPU quota per memory size; warm invocations in-process)", title_justify="left")
    for column in ("memory MB", "vCPU", "init ms", "p50 ms", "p99 ms", "billed ms", "$ per 1M", "peak MB"):
        out.add_column(column, justify="right")
    best = sizing.cheapest(sizes, options.p99_ms)
    for size in sizes:
        capped = f" (capped {size.emulated_cpus:g})" if size.emulated_cpus < size.vcpus else ""
        out.add_row(
            f"{size.memory_mb}{' *' if size is best else ''}",
            f"{size.vcpus:.2f}{capped}",
            f"{size.init_ms:,.0f}",
            f"{size.p50:.2f}",
            f"{size.p99:.2f}",
            f"{size.billed_ms:.2f}",
            f"{size.cost_per_million:.3f}",
            f"{size.peak_mb:.0f}" + ("" if size.fits else " (too big)"),
        )
    console.print(out)
    if best is not None:
        console.print(
            f"cheapest{' within the p99 budget' if options.p99_ms is not None else ''} (*): MemorySize: "
            f"{best.memory_mb} (${best.cost_per_million:.3f} per million requests at ${options.price_gb_second}/GB-s "
            f"and ${options.price_per_million}/million)",
            highlight=False,
        )
    options.out.mkdir(parents=True, exist_ok=True)
    path = options.out / "lambda.json"
    path.write_text(json.dumps([asdict(s) | {"fits": s.fits} for s in sizes], indent=2))
    return [path]
