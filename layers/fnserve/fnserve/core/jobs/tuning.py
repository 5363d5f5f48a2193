"""Choosing a cascade's threshold: how often the slow model is skipped, and what accuracy that buys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fnserve.core.codec.datafiles import DataFile
from fnserve.core.errors import InvalidInput
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.cascade import confidence
from fnserve.core.models.manifest.cascades import CascadeSettings

THRESHOLDS = np.round(np.concatenate([np.arange(0.30, 0.949, 0.05), np.arange(0.95, 0.991, 0.01), [0.995, 0.999]]), 3)


@dataclass(frozen=True)
class Row:
    threshold: float
    skip_share: float  # requests answered by the fast model alone
    accuracy: float  # of the combined answer


@dataclass(frozen=True)
class Tuning:
    fast_accuracy: float
    slow_accuracy: float
    rows: list[Row]

    def recommend(self, target: float) -> Row | None:
        """The threshold that skips the slow model most often while reaching ``target`` accuracy."""
        good = [r for r in self.rows if r.accuracy >= target]
        return max(good, key=lambda r: (r.skip_share, -r.threshold)) if good else None


def tune(service: InferenceService, cascade: CascadeSettings, data: DataFile) -> Tuning:
    """Run both models on labelled data and score every threshold of the grid."""
    if data.labels is None:
        raise InvalidInput("tuning needs labels in the data file (labels, label or y)")
    fast = service.predict(cascade.fast, data.inputs, version=cascade.fast_version)
    slow = service.predict(cascade.slow, data.inputs, version=cascade.slow_version)
    for model, outputs in ((cascade.fast, fast), (cascade.slow, slow)):
        if cascade.output not in outputs:
            raise InvalidInput(f"model {model!r} has no output {cascade.output!r}")
    fast_pred = fast[cascade.output].argmax(axis=1)
    slow_pred = slow[cascade.output].argmax(axis=1)
    conf = confidence(fast[cascade.output], cascade)
    labels = data.labels
    rows = []
    for t in THRESHOLDS:
        sure = conf >= t
        combined = np.where(sure, fast_pred, slow_pred)
        rows.append(Row(float(t), float(sure.mean()), float((combined == labels).mean())))
    return Tuning(float((fast_pred == labels).mean()), float((slow_pred == labels).mean()), rows)


def plot(tuning: Tuning, cascade: CascadeSettings, path: Path, target: float | None) -> None:
    """Accuracy against the share of requests that go to the slow model, one point per threshold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    share = [1 - r.skip_share for r in tuning.rows]
    accuracy = [r.accuracy for r in tuning.rows]
    ax.plot(share, accuracy, marker="o", markersize=3, label=f"{cascade.fast} -> {cascade.slow} ({cascade.rule})")
    for r in tuning.rows[:: max(1, len(tuning.rows) // 8)]:
        ax.annotate(
            f"{r.threshold:g}", (1 - r.skip_share, r.accuracy), fontsize=7, xytext=(4, -8), textcoords="offset points"
        )
    ax.axhline(tuning.slow_accuracy, color="grey", linestyle="--", linewidth=0.8, label=f"{cascade.slow} alone")
    ax.axhline(tuning.fast_accuracy, color="grey", linestyle=":", linewidth=0.8, label=f"{cascade.fast} alone")
    if target is not None:
        ax.axhline(target, color="tab:red", linewidth=0.8, label=f"target {target:g}")
    ax.set_xlabel("share of requests sent to the slow model")
    ax.set_ylabel("accuracy of the combined answer")
    ax.set_title(f"cascade {cascade.name}: threshold trade-off")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table(tuning: Tuning, recommended: Row | None) -> list[str]:
    """The tuning as Markdown table lines."""
    lines = ["| threshold | slow model skipped | combined accuracy |", "| --- | --- | --- |"]
    for r in tuning.rows:
        mark = " **recommended**" if recommended is not None and r == recommended else ""
        lines.append(f"| {r.threshold:g} | {r.skip_share:.1%} | {r.accuracy:.4f}{mark} |")
    return lines
