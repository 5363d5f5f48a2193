"""A worker group: models that ``fnserve serve`` runs in worker processes of their own."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from fnserve.core.models.manifest.entries import Entry


class WorkerGroup(Entry, frozen=True, kw_only=True):
    """Models that ``fnserve serve`` runs in worker processes of their own, as Triton's instance groups and
    MLServer's per-model workers do: each of the group's workers holds its models and no other, so memory grows
    with what each group holds, not with workers x models. Models in no group run in the front process."""

    name: Annotated[str, Meta(min_length=1, description="The group's name (in metadata, metrics and logs).")]
    workers: Annotated[int, Meta(ge=1, le=64, description="Its worker processes, each holding all its models.")] = 1
    models: Annotated[list[str], Meta(min_length=1, description="The models (every version of each) its workers hold.")]
