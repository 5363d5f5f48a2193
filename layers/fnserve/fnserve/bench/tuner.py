"""``fnserve bench``: the floor, the staged sweep, the recommendation, and a confirming run.

The recommendation is the configuration with the most answers per second whose p99 stays within the
budget (``p99_ms``; any p99 without one) at some concurrency, at the concurrency where it does; the
latency pick is the configuration with the lowest p50 at the lowest concurrency measured. The
recommended configuration is then started afresh and loaded again at its concurrency, for longer,
and both figures are reported: a recommendation that does not reproduce says so.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from fnserve.bench import floor as raw
from fnserve.bench import load as loadgen
from fnserve.bench.requests import Request, Target
from fnserve.bench.sweep import (
    Config,
    LoadOptions,
    Point,
    Result,
    batchings,
    best_config,
    layouts,
    measure_point,
    pinning,
    saturate,
    serving,
    tunings,
)
from fnserve.core.errors import ConfigError, InvalidInput
from fnserve.core.execution.servable import PipelineServable
from fnserve.core.execution.service import InferenceService
from fnserve.core.host import available_cpus

STAGES = ("layout", "threads", "batching")


@dataclass(frozen=True)
class Plan:
    manifest: Path
    target: str
    requests: list[Request]
    p99_ms: float | None = None
    stages: tuple[str, ...] = STAGES
    load: LoadOptions = LoadOptions()
    floor_seconds: float = 0.5
    confirm_seconds: float = 5.0


@dataclass
class Report:
    target: str
    model: str
    cpus: int
    rows: int
    floor: raw.Floor
    generator: str
    generator_ceiling: float
    p99_ms: float | None
    results: list[Result] = field(default_factory=list)
    recommended: Result | None = None
    fastest: Result | None = None  # the lowest latency
    confirmed: Point | None = None

    def recommended_point(self) -> Point | None:
        return self.recommended.best(self.p99_ms) if self.recommended is not None else None


def resolve(service: InferenceService, name: str | None) -> Target:
    """The model or pipeline ``name`` (the manifest's only model when None) as a benchmark target."""
    manifest = service.registry.manifest
    if name is None:
        names = sorted({m.name for m in manifest.models})
        if len(names) != 1:
            raise InvalidInput(f"the manifest serves {len(names)} models ({', '.join(names)}): choose one with --model")
        name = names[0]
    if name in service.pipelines:
        servable = service.servable(name)
        assert isinstance(servable, PipelineServable)
        return Target(name, servable.inputs, servable.model, servable.pipeline)
    if name in {c.name for c in manifest.cascades}:
        raise InvalidInput(f"{name!r} is a cascade: benchmark its fast and slow models one at a time")
    if name not in {m.name for m in manifest.models}:
        raise InvalidInput(f"the manifest has no model or pipeline {name!r}")
    model = service.registry.get(name)
    return Target(name, model.inputs, model)


def floor_batches(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to the model's largest batch (at most 64)."""
    found, b = [], 1
    while b <= min(64, max_batch_size):
        found.append(b)
        b *= 2
    return found


def thread_counts(cpus: int) -> list[int]:
    found, t = [], 1
    while t < cpus:
        found.append(t)
        t *= 2
    return [*found, cpus]


def run(plan: Plan, target: Target, progress: Callable[[str], None] = lambda _: None) -> Report:
    """Measure the floor, sweep the configurations stage by stage, recommend and confirm."""
    cpus = available_cpus()
    first = plan.requests[0]
    progress("raw onnxruntime")
    floor = raw.measure(
        target.model.path,
        target.model_feed(first.inputs),
        batches=floor_batches(target.model.settings.max_batch_size),
        threads=thread_counts(cpus),
        cpus=cpus,
        seconds=plan.floor_seconds,
        progress=progress,
    )
    use_wrk = plan.load.wrk() and all(r.headers.get("Content-Type") == "application/json" for r in plan.requests)
    progress("the load generator's own ceiling")
    # perf_analyzer only speaks V2 to a model: the ceiling of the generator beside it bounds what the machine gives.
    ceiling = loadgen.ceiling(wrk=use_wrk, seconds=1.0)
    report = Report(
        plan.target,
        target.model.name,
        cpus,
        first.rows,
        floor,
        "perf_analyzer" if plan.load.perf_analyzer() else "wrk" if use_wrk else "built-in",
        ceiling,
        plan.p99_ms,
    )
    workdir = Path(tempfile.mkdtemp(prefix="fnserve-bench-"))
    try:
        stage_configs: dict[str, Callable[[Config], list[Config]]] = {
            "layout": lambda _: layouts(cpus),
            "threads": lambda best: tunings(best, cpus),
            "batching": lambda best: batchings(
                best, target.model.settings.max_batch_size, target.model.settings.max_batch_time_ms is not None
            ),
        }
        best = Config()
        for stage in plan.stages:
            configs = stage_configs[stage](best)
            if stage == "threads":  # threads first, then pinning on the best of them
                _sweep(plan, report, stage, configs, workdir, progress)
                best = _best(report, best)
                configs = pinning(best, cpus)
            _sweep(plan, report, stage, configs, workdir, progress)
            best = _best(report, best)
        report.recommended = best_config(report.results, plan.p99_ms)
        report.fastest = _fastest(report.results)
        if report.recommended is not None and plan.confirm_seconds > 0:
            point = report.recommended_point()
            assert point is not None
            progress(f"confirming: {report.recommended.config.label()} at concurrency {point.concurrency}")
            with serving(plan.manifest, plan.target, report.recommended.config, first, directory=workdir) as server:
                options = replace(plan.load, seconds=plan.confirm_seconds)
                measure_point(server, plan.target, plan.requests, point.concurrency, replace(options, seconds=1.0))
                report.confirmed = measure_point(server, plan.target, plan.requests, point.concurrency, options)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _sweep(
    plan: Plan, report: Report, stage: str, configs: Sequence[Config], workdir: Path, progress: Callable[[str], None]
) -> None:
    done = {r.config for r in report.results}
    for config in configs:
        if config in done:
            continue
        result = Result(config, stage)
        report.results.append(result)
        try:
            with serving(plan.manifest, plan.target, config, plan.requests[0], directory=workdir) as server:
                result.points = saturate(
                    server,
                    plan.target,
                    plan.requests,
                    plan.load,
                    functools.partial(_progress, progress, f"{stage}: {config.label()}: "),
                )
        except ConfigError as exc:  # a configuration that cannot start (memory, say) is reported, not fatal
            result.error = exc.message


def _progress(progress: Callable[[str], None], prefix: str, what: str) -> None:
    progress(prefix + what)


def _best(report: Report, current: Config) -> Config:
    found = best_config(report.results, report.p99_ms)
    return found.config if found is not None else current


def _fastest(results: Sequence[Result]) -> Result | None:
    """The configuration with the lowest p50 (then p99) at the lowest concurrency it was measured at."""
    ranked = [r for r in results if r.points and not r.points[0].errors]
    return min(ranked, key=lambda r: (r.points[0].p50, r.points[0].p99)) if ranked else None
