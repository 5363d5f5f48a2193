"""A cascade: a fast model that answers at once and a slow one that follows up where it is unsure."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from fnserve.core.models.manifest.entries import Entry
from fnserve.core.models.names import check_name


class CascadeSettings(Entry, frozen=True, kw_only=True):
    """A cascade in the manifest: served as a model of its own name."""

    name: Annotated[str, Meta(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")]
    fast: Annotated[str, Meta(description="The fast model (or pipeline), which answers at once.")]
    fast_version: Annotated[str, Meta(description="Its version (default: latest).")] | None = None
    slow: Annotated[str, Meta(description="The slow, accurate model (or pipeline), run as a follow-up.")]
    slow_version: Annotated[str, Meta(description="Its version (default: latest).")] | None = None
    output: Annotated[str, Meta(description="The fast model's output the confidence rule reads ([rows, classes]).")]
    scores: Annotated[
        Literal["probabilities", "logits"], Meta(description="What the output holds; logits go through a softmax.")
    ] = "probabilities"
    rule: Annotated[
        Literal["top1", "margin"],
        Meta(description="top1: top-class probability >= threshold; margin: top1 - top2 >= threshold."),
    ] = "top1"
    threshold: Annotated[
        float, Meta(ge=0.0, le=1.0, description="Confident at or above this; tune with `fnserve cascade tune`.")
    ]
    queue_url: (
        Annotated[str, Meta(description="Follow-up queue; default: FNSERVE_FOLLOWUP_QUEUE_URL of the server settings.")]
        | None
    ) = None
    result_ttl_seconds: Annotated[int, Meta(ge=60, description="How long follow-up results are kept.")] = 86_400

    def __post_init__(self) -> None:
        for name in (self.name, self.fast, self.slow):
            check_name(name, "name")
        if self.fast == self.slow and self.fast_version == self.slow_version:
            raise ValueError(f"cascade {self.name!r}: fast and slow are the same model")
