"""What ``fnserve bench`` writes: a table, the recommendation as a snippet to paste, every figure as
JSON, and PNG plots (throughput against concurrency, latency percentiles) with matplotlib."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fnserve.bench.sweep import Point, Result
from fnserve.bench.tuner import Report

JSON_FILE = "bench.json"
SNIPPET_FILE = "recommended.txt"
THROUGHPUT_PNG = "throughput.png"
LATENCY_PNG = "latency.png"


def rows(report: Report) -> list[dict[str, Any]]:
    """One row per configuration: its best point within the budget (or its best at all, flagged)."""
    found = []
    capacity = report.floor.capacity
    for result in report.results:
        point = result.best(report.p99_ms)
        over = point is None and result.best() is not None
        point = point or result.best()
        row: dict[str, Any] = {"stage": result.stage, "config": result.config.label(), "error": result.error}
        if point is not None:
            row |= {
                "concurrency": point.concurrency,
                "rate": point.rate,
                "p50": point.p50,
                "p99": point.p99,
                "cpu_ms": point.cpu_ms,
                "floor_ratio": point.rate / capacity if capacity else math.nan,
                "over_budget": over,
            }
        found.append(row)
    return found


def table(report: Report) -> Any:
    """The results as a rich table."""
    from rich.table import Table

    budget = f", p99 <= {report.p99_ms:g} ms" if report.p99_ms is not None else ""
    out = Table(
        title=f"fnserve bench: {report.target} ({report.cpus} CPUs{budget})",
        title_justify="left",
        caption="proc: front processes; wkr: inference workers each (0: inference in the front process); thr: "
        "intra-op threads per inference process; batch N/T: max_batch_size/max_batch_time_ms. "
        "* recommended, ^ lowest latency",
        caption_justify="left",
    )
    for column, justify in (
        ("stage", "left"),
        ("configuration", "left"),
        ("conc.", "right"),
        ("req/s", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("CPU ms/req", "right"),
        ("x raw floor", "right"),
    ):
        out.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row, result in zip(rows(report), report.results, strict=True):
        mark = " *" if result is report.recommended else (" ^" if result is report.fastest else "")
        if "rate" not in row:  # the error's last line (bench.json has all of it)
            reason = (row["error"] or "no answer without errors").strip().splitlines()[-1]
            out.add_row(row["stage"], row["config"] + mark, "", "", "", "", "", reason)
            continue
        p99 = f"{row['p99']:.2f}" + (" (over)" if row["over_budget"] else "")
        out.add_row(
            row["stage"],
            row["config"] + mark,
            str(row["concurrency"]),
            f"{row['rate']:,.0f}",
            f"{row['p50']:.2f}",
            p99,
            f"{row['cpu_ms']:.3f}",
            f"{row['floor_ratio']:.2f}",
        )
    return out


def summary(report: Report, manifest: Path) -> str:
    """The floor, the recommendation and its confirmation, the latency pick, and the snippet to paste."""
    floor = report.floor
    best = floor.best()
    lines = [
        f"raw onnxruntime floor at batch {report.rows}: {floor.capacity:,.0f} requests/s; "
        f"most rows/s at batch {best.batch}, {best.threads} thread(s) x {best.processes} process(es): "
        f"{best.rows_per_second:,.0f} (what batching could reach at best)",
        f"load generator: {report.generator}, its own ceiling on this machine at least "
        f"{report.generator_ceiling:,.0f} requests/s (it shares the CPUs with the server)"
        if report.generator != "perf_analyzer"
        else f"load generator: perf_analyzer; this machine's loopback ceiling (fnserve's own generator against a "
        f"bare server) at least {report.generator_ceiling:,.0f} requests/s",
    ]
    point = report.recommended_point()
    if report.recommended is None or point is None:
        budget = f" with p99 <= {report.p99_ms:g} ms" if report.p99_ms is not None else ""
        lines.append(f"no configuration answered without errors{budget}: nothing to recommend")
        return "\n".join(lines)
    lines.append(
        f"recommended (*, most throughput{' within the p99 budget' if report.p99_ms is not None else ''}): "
        f"{report.recommended.config.label()}: {point.rate:,.0f} req/s at concurrency {point.concurrency}, "
        f"p99 {point.p99:.2f} ms, {point.rate / floor.capacity:.2f}x the raw floor"
    )
    if report.confirmed is not None:
        change = report.confirmed.rate / point.rate - 1
        lines.append(
            f"  confirmed by a fresh server, {report.confirmed.generator}, {report.confirmed.concurrency} connections: "
            f"{report.confirmed.rate:,.0f} req/s ({change:+.1%}), p99 {report.confirmed.p99:.2f} ms"
        )
    if report.fastest is not None:
        first = report.fastest.points[0]
        lines.append(
            f"lowest latency (^): {report.fastest.config.label()}: p50 {first.p50:.2f} ms, p99 {first.p99:.2f} ms "
            f"at concurrency {first.concurrency}"
        )
    lines += ["", snippet(report, manifest)]
    return "\n".join(lines)


def snippet(report: Report, manifest: Path) -> str:
    assert report.recommended is not None
    return report.recommended.config.snippet(manifest, report.target, report.model)


def to_json(report: Report) -> dict[str, Any]:
    """Every figure of the run."""
    return {
        "target": report.target,
        "model": report.model,
        "cpus": report.cpus,
        "rows_per_request": report.rows,
        "p99_budget_ms": report.p99_ms,
        "generator": report.generator,
        "generator_ceiling": report.generator_ceiling,
        "floor": {"capacity": report.floor.capacity, "points": [_clean(asdict(p)) for p in report.floor.points]},
        "results": [_clean(r.to_dict()) for r in report.results],
        "recommended": report.recommended.config.label() if report.recommended else None,
        "recommended_point": _clean(asdict(p)) if (p := report.recommended_point()) else None,
        "lowest_latency": report.fastest.config.label() if report.fastest else None,
        "confirmed": _clean(asdict(report.confirmed)) if report.confirmed else None,
        "table": [_clean(row) for row in rows(report)],
    }


def _clean(value: Any) -> Any:
    """NaN as null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write(report: Report, manifest: Path, out: Path) -> list[Path]:
    """The JSON, the snippet and the plots in ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / JSON_FILE]
    (out / JSON_FILE).write_text(json.dumps(to_json(report), indent=2))
    if report.recommended is not None:
        (out / SNIPPET_FILE).write_text(snippet(report, manifest) + "\n")
        written.append(out / SNIPPET_FILE)
    written += plot(report, out)
    return written


def plot(report: Report, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in report.results if r.points]
    if not measured:
        return []
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for result in measured:
        style = "-" if result is report.recommended else "--"
        ax.plot(
            [p.concurrency for p in result.points],
            [p.rate for p in result.points],
            style,
            marker="o",
            label=_label(result, report),
        )
    floor = report.floor.capacity
    title = f"fnserve bench: {report.target}, {report.cpus} CPUs"
    if floor <= 2 * max((p.rate for r in measured for p in r.points), default=0.0):
        ax.axhline(floor, color="black", linewidth=1, linestyle=":", label="raw onnxruntime floor")
    else:  # a model so light that the floor would flatten every curve: named, not drawn
        title += f" (raw onnxruntime floor {floor:,.0f}/s, off the chart)"
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent connections (closed loop)")
    ax.set_ylabel("answers per second")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out / THROUGHPUT_PNG, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 5.5))
    names = [_label(r, report) for r in measured]
    bests: list[Point] = [r.best(report.p99_ms) or r.points[0] for r in measured]
    ys = range(len(measured))
    for key, color in (("p99", "tab:red"), ("p90", "tab:orange"), ("p50", "tab:blue")):
        ax.barh(list(ys), [getattr(p, key) for p in bests], color=color, label=key)
    if report.p99_ms is not None:
        ax.axvline(report.p99_ms, color="black", linestyle=":", label=f"p99 budget {report.p99_ms:g} ms")
    ax.set_yticks(list(ys), [f"{n} @ {p.concurrency}" for n, p in zip(names, bests, strict=True)], fontsize=7)
    ax.set_xlabel("latency (ms) at each configuration's best concurrency")
    ax.set_title("latency percentiles")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / LATENCY_PNG, dpi=110)
    plt.close(fig)
    return [out / THROUGHPUT_PNG, out / LATENCY_PNG]


def _label(result: Result, report: Report) -> str:
    return result.config.label() + (" (recommended)" if result is report.recommended else "")
