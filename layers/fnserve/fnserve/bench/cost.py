"""``fnserve bench --targets``, end to end: a request's time at one vCPU and the cold start measured here (the
Lambda handler under a one-vCPU quota, as ``--lambda`` measures it), every target costed at the traffic profile
(``fnserve.bench.targets``), the recommendation printed first, then the table; the table, every figure and the chart
(``fnserve.bench.chart``) written to ``--out``."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fnserve.bench import chart, prices, sizing, targets
from fnserve.bench.requests import Request
from fnserve.bench.targets import Choices, Measured, Profile, Row

if TYPE_CHECKING:
    from rich.console import Console

    from fnserve.core.execution.service import InferenceService

JSON_FILE = "targets.json"
TABLE_FILE = "targets.txt"
LOWEST_RPS, HIGHEST_RPS = 0.001, 10_000.0  # the chart's traffic, widened to a decade either side of the profile's


@dataclass(frozen=True)
class Traffic:
    """The profile as the command line gives it: what is left None is taken from the requests bench sends."""

    rps: float
    peak_rps: float | None = None  # None: the mean
    bytes_in: int | None = None  # None: the request's body
    bytes_out: int | None = None  # None: its answer's
    choices: Choices = Choices()


def measure(
    manifest: Path, target: str, request: Request, *, machine_cpus: int, seconds: float, progress: Callable[[str], None]
) -> Measured | str:
    """A request's time and p99, the cold start and the peak memory, at one full vCPU; or why it cannot be measured."""
    found = sizing.measure(
        manifest, target, request, (sizing.FULL_VCPU_MB,), machine_cpus=machine_cpus, seconds=seconds, progress=progress
    )
    if isinstance(found, str):
        return found
    size = found[0]
    return Measured(cpu_ms=size.p50, p99_ms=size.p99, start_ms=size.init_ms, memory_mb=size.peak_mb)


def answer_bytes(service: InferenceService, target: str, request: Request) -> int:
    """The size of the V2 JSON answer to ``request``."""
    from fnserve.core.codec.tensors import InferenceRequest, encode_response

    prediction = service.infer(target, request.inputs)
    body, _ = encode_response(prediction.model, prediction.version, prediction.outputs, InferenceRequest(inputs={}))
    return len(body)


def profile(traffic: Traffic, p99_ms: float | None, bytes_in: int, bytes_out: int) -> Profile:
    """The profile costed: ``traffic``, its blanks filled with the measured request's sizes."""
    return Profile(
        rps=traffic.rps,
        peak_rps=traffic.peak_rps if traffic.peak_rps is not None else traffic.rps,
        bytes_in=traffic.bytes_in if traffic.bytes_in is not None else bytes_in,
        bytes_out=traffic.bytes_out if traffic.bytes_out is not None else bytes_out,
        p99_ms=p99_ms,
    )


def grid(at: Profile) -> list[float]:
    return targets.traffic(min(LOWEST_RPS, at.rps / 10), max(HIGHEST_RPS, at.rps * 10))


def rate(rps: float) -> str:
    """Requests a second, to three figures: 0.00512, 91.5, 2,570."""
    return f"{rps:,.0f}" if rps >= 100 else f"{rps:.3g}"


def money(usd: float) -> str:
    """Dollars: cents, or three figures below a dollar."""
    return f"{usd:,.2f}" if usd >= 1 else f"{usd:.3g}"


def changes(breaks: Sequence[targets.BreakEven]) -> str:
    """Where the cheapest changes, in words; two targets that keep overtaking each other (their sizes step at
    different traffic) are said once."""
    words = [breaks[0].below or "nothing meets the budget"]
    i = 0
    while i < len(breaks):
        j = i
        while j + 1 < len(breaks) and (breaks[j + 1].below, breaks[j + 1].above) == (breaks[j].above, breaks[j].below):
            j += 1
        if j > i:
            pair = f"{breaks[i].above or 'nothing'} and {breaks[i].below or 'nothing'}"
            words.append(f"{pair} take turns from {rate(breaks[i].rps)} to {rate(breaks[j].rps)}")
        else:
            words.append(f"{breaks[i].above or 'nothing'} from {rate(breaks[i].rps)}")
        i = j + 1
    return "; ".join(words)


def summary(measured: Measured, at: Profile, found: Sequence[Row], breaks: Sequence[targets.BreakEven]) -> str:
    """The answer first (or why there is none), each family's best, where the cheapest changes, what was measured."""
    budget = f"p99 <= {at.p99_ms:g} ms" if at.p99_ms is not None else "no p99 budget"
    shape = f"{rate(at.rps)} req/s mean, {rate(at.peak_rps)} at peak, {at.bytes_in:,} bytes in, {at.bytes_out:,} out"
    best = targets.cheapest(found, at.p99_ms)
    if best is None:
        quickest = targets.fastest(found)
        reason = f"the lowest p99 is {quickest.named}'s, {quickest.p99_ms:,.2f} ms" if quickest else "none fits"
        lines = [f"no target meets {budget} at {shape}: {reason}. Raise --p99-ms, or lower --peak-rps."]
    else:
        lines = [
            f"recommended (*): {best.named}: ${best.month:,.2f} a month, ${best.per_million:.3f} per million requests, "
            f"p99 {best.p99_ms:,.2f} ms ({shape}, {budget})"
        ]
        for family, row in targets.by_family(found, at.p99_ms).items():
            lines.append(f"  cheapest {family}: {row.named}, ${row.month:,.2f} a month, p99 {row.p99_ms:,.2f} ms")
    if breaks:
        lines.append(f"break-even, the cheapest within the budget as the mean grows: {changes(breaks)}")
    lines.append(
        f"measured here at one vCPU: {measured.cpu_ms:.2f} ms a request (p99 {measured.p99_ms:.2f}), cold start "
        f"{measured.start_ms:,.0f} ms (import and model load in a fresh process), peak {measured.memory_mb:,.0f} MB"
    )
    return "\n".join(lines)


DOORS = {
    targets.OWN: "each platform's own endpoint (--front-door api: a managed API before each)",
    targets.API: "a managed API before each (--front-door own: each platform's own endpoint)",
}


def table(found: Sequence[Row], at: Profile, door: str = targets.OWN) -> Any:
    """Every target as a rich table, the recommended marked."""
    from rich import box
    from rich.table import Table

    best = targets.cheapest(found, at.p99_ms)
    out = Table(
        title=f"each target at {rate(at.rps)} req/s (peak {rate(at.peak_rps)})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption=f"front door: {DOORS[door]}. Prices of {prices.AS_OF}: us-east-1, Cloud Run's tier 1, the container's "
        "given. xN: provisioned concurrency. cold: requests that meet a cold start. * recommended",
        caption_justify="left",
    )
    for column, justify in (
        ("target", "left"),
        ("size", "left"),
        ("front door", "left"),
        ("vCPU", "right"),
        ("$/month", "right"),
        ("$/1M req", "right"),
        ("p99 ms", "right"),
        ("cold", "right"),
        ("", "left"),
    ):
        out.add_column(column, justify=justify, no_wrap=column != "target", overflow="fold")  # type: ignore[arg-type]
    for row in found:
        over = at.p99_ms is not None and row.p99_ms > at.p99_ms
        out.add_row(
            row.target,
            row.size + (" *" if row is best else ""),
            row.door,
            f"{row.vcpus:.2f}",
            money(row.month),
            money(row.per_million),
            "inf" if math.isinf(row.p99_ms) else f"{row.p99_ms:,.2f}",
            f"{row.cold_share:.1%}" if row.cold_share >= 0.0005 else "0",
            row.note or ("over" if over else ""),
        )
    return out


def curves(
    measured: Measured, at: Profile, choices: Choices, rps: Sequence[float]
) -> dict[str, list[tuple[float, float | None]]]:
    """Each family's best cost a month within the budget along ``rps`` (None where none of it meets the budget)."""
    costs = [targets.family_costs(measured, at, choices, r) for r in rps]
    return {family: [(r, c.get(family)) for r, c in zip(rps, costs, strict=True)] for family in targets.FAMILIES}


def drawing(measured: Measured, at: Profile, choices: Choices, rps: Sequence[float], name: str) -> chart.Chart:
    """The chart of each family's cost a month along ``rps``, the profile's traffic marked."""
    budget = f", p99 <= {at.p99_ms:g} ms" if at.p99_ms is not None else ""
    return chart.Chart(
        title=f"{name}: cost a month on each target, its cheapest size within the budget{budget}",
        curves=chart.curves(curves(measured, at, choices, rps)),
        marked=at.rps,
        marked_label=f"profile: {rate(at.rps)} req/s",
    )


def run(console: Console, measured: Measured, at: Profile, choices: Choices, out: Path, name: str) -> list[Path]:
    """Cost every target, print the answer and the table, and write them with the chart; the files written."""
    from rich.console import Console

    found = targets.rows(measured, at, choices)
    rps = grid(at)
    breaks = targets.break_evens(lambda r: targets.family_costs(measured, at, choices, r), rps)
    text = summary(measured, at, found, breaks)
    console.print(text, highlight=False, markup=False)
    console.print(table(found, at, choices.front_door))
    buffer = io.StringIO()
    Console(file=buffer, width=160, color_system=None).print(table(found, at, choices.front_door))
    rendered = text + "\n\n" + buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    (out / TABLE_FILE).write_text(rendered)
    figures = {
        "measured": asdict(measured),
        "profile": asdict(at),
        "choices": asdict(choices),
        "prices_as_of": prices.AS_OF,
        "recommended": (best.named if (best := targets.cheapest(found, at.p99_ms)) else None),
        "rows": [asdict(r) | {"p99_ms": None if math.isinf(r.p99_ms) else r.p99_ms} for r in found],
        "break_evens": [asdict(b) for b in breaks],
    }
    (out / JSON_FILE).write_text(json.dumps(figures, indent=2))
    drawn = drawing(measured, at, choices, rps, name)
    return [out / TABLE_FILE, out / JSON_FILE, *chart.write(drawn, out, rendered)]
