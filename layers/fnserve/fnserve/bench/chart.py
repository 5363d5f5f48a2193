"""The chart ``fnserve bench --targets`` writes: cost a month against traffic, log-log, one line per target family,
the profile's traffic marked. The same lines go to a PNG (matplotlib, which ``fnserve[bench]`` brings for the sweep's
plots) and to an HTML page that draws them in inline SVG, with no script and nothing fetched."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PNG_FILE = "targets.png"
HTML_FILE = "targets.html"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT = 1000, 540
LEFT, TOP, RIGHT, BOTTOM = 80, 50, 720, 470  # the plot area, in the SVG's pixels; the legend is right of it
STROKE = 3
EMPTY = "no line: nothing meets the budget at this traffic"


@dataclass(frozen=True)
class Curve:
    """One line: ``points`` are (x, y); a y of None leaves a gap there."""

    name: str
    colour: str
    points: tuple[tuple[float, float | None], ...]

    def segments(self) -> list[list[tuple[float, float]]]:
        """The runs of points with a value, each drawn as one polyline."""
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in self.points:
            if y is None or y <= 0:
                runs.append([])
            else:
                runs[-1].append((x, y))
        return [run for run in runs if run]


@dataclass(frozen=True)
class Chart:
    title: str
    curves: tuple[Curve, ...]
    marked: float  # the x marked with a line (the profile's traffic)
    marked_label: str
    x_label: str = "mean requests a second"
    y_label: str = "$ a month"


def curves(named: Mapping[str, Sequence[tuple[float, float | None]]]) -> tuple[Curve, ...]:
    """A curve for each name, coloured in order from ``PALETTE``."""
    return tuple(
        Curve(name, PALETTE[i % len(PALETTE)], tuple(points)) for i, (name, points) in enumerate(named.items())
    )


def decades(values: Sequence[float]) -> tuple[int, int]:
    """The powers of ten that bracket ``values`` (at least one decade apart)."""
    low = math.floor(math.log10(min(values)))
    return low, max(low + 1, math.ceil(math.log10(max(values))))


def number(value: float) -> str:
    """A power of ten as an axis label: 0.001, 1, 10k."""
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


@dataclass(frozen=True)
class _Scale:
    low: int
    high: int
    start: float
    end: float

    def __call__(self, value: float) -> float:
        share = (math.log10(value) - self.low) / (self.high - self.low)
        return self.start + share * (self.end - self.start)


def _scales(chart: Chart) -> tuple[_Scale, _Scale]:
    points = [p for c in chart.curves for run in c.segments() for p in run]
    xs = [x for x, _ in points] + [chart.marked]
    ys = [y for _, y in points] or [1.0]
    return _Scale(*decades(xs), LEFT, RIGHT), _Scale(*decades(ys), BOTTOM, TOP)


def svg(chart: Chart) -> str:
    """The chart as an SVG element."""
    x, y = _scales(chart)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="28" font-size="15">{html.escape(chart.title)}</text>',
    ]
    for power in range(x.low, x.high + 1):
        at = x(10.0**power)
        out.append(f'<line x1="{at:.1f}" y1="{TOP}" x2="{at:.1f}" y2="{BOTTOM}" stroke="#dddddd"/>')
        out.append(f'<text x="{at:.1f}" y="{BOTTOM + 18}" text-anchor="middle">{number(10.0**power)}</text>')
    for power in range(y.low, y.high + 1):
        at = y(10.0**power)
        out.append(f'<line x1="{LEFT}" y1="{at:.1f}" x2="{RIGHT}" y2="{at:.1f}" stroke="#dddddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{at + 4:.1f}" text-anchor="end">${number(10.0**power)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" stroke="#333"/>')
    out.append(
        f'<text x="{(LEFT + RIGHT) / 2}" y="{BOTTOM + 40}" text-anchor="middle">{html.escape(chart.x_label)}</text>'
    )
    out.append(
        f'<text x="18" y="{(TOP + BOTTOM) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {(TOP + BOTTOM) / 2})">{html.escape(chart.y_label)}</text>'
    )
    mark = x(chart.marked)
    out.append(
        f'<line x1="{mark:.1f}" y1="{TOP}" x2="{mark:.1f}" y2="{BOTTOM}" stroke="#555555" stroke-dasharray="6 4"/>'
    )
    out.append(f'<text x="{mark + 4:.1f}" y="{TOP + 14}">{html.escape(chart.marked_label)}</text>')
    if not any(c.segments() for c in chart.curves):
        out.append(f'<text x="{(LEFT + RIGHT) / 2}" y="{(TOP + BOTTOM) / 2}" text-anchor="middle">{EMPTY}</text>')
    for curve in chart.curves:
        for run in curve.segments():
            points = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in run)
            out.append(
                f'<polyline points="{points}" fill="none" stroke="{curve.colour}" stroke-width="{STROKE}" '
                'stroke-linejoin="round"/>'
            )
    for i, curve in enumerate(chart.curves):
        row = TOP + 10 + 22 * i
        out.append(
            f'<line x1="{RIGHT + 16}" y1="{row}" x2="{RIGHT + 40}" y2="{row}" stroke="{curve.colour}" '
            f'stroke-width="{STROKE}"/>'
        )
        out.append(f'<text x="{RIGHT + 46}" y="{row + 4}">{html.escape(curve.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def page(chart: Chart, below: str = "") -> str:
    """A self-contained HTML page: the chart, then ``below`` (preformatted text: the recommendation, the table)."""
    text = f"<pre>{html.escape(below)}</pre>" if below else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(chart.title)}</title></head>\n"
        f'<body style="margin:0;background:#ffffff">\n{svg(chart)}\n{text}\n</body></html>\n'
    )


def png(chart: Chart, path: Path) -> None:
    """The chart as a PNG, drawn by matplotlib from the same curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH / 100, HEIGHT / 100))
    for curve in chart.curves:
        ys = [math.nan if y is None or y <= 0 else y for _, y in curve.points]
        ax.plot([x for x, _ in curve.points], ys, color=curve.colour, linewidth=2, label=curve.name)
    ax.axvline(chart.marked, color="#555555", linestyle="--", linewidth=1, label=chart.marked_label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    if not any(c.segments() for c in chart.curves):  # nothing to scale the axes by
        x, y = _scales(chart)
        ax.set_xlim(10.0**x.low, 10.0**x.high)
        ax.set_ylim(10.0**y.low, 10.0**y.high)
        ax.text(0.5, 0.5, EMPTY, transform=ax.transAxes, ha="center")
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.set_title(chart.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(chart: Chart, out: Path, below: str = "") -> list[Path]:
    """The PNG and the HTML page in ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    png(chart, out / PNG_FILE)
    (out / HTML_FILE).write_text(page(chart, below))
    return [out / PNG_FILE, out / HTML_FILE]
