"""A pipeline: steps around a model, served under a name of its own, and how an embedding pipeline is served."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from fnserve.core.models.manifest.entries import Entry
from fnserve.core.models.manifest.steps import MeanPoolStep, PoolStep, Step, TokenizeStep
from fnserve.core.models.names import check_name


class EmbeddingSettings(Entry, frozen=True, kw_only=True):
    """How OpenAI's embeddings API (``POST /v1/embeddings``) serves a pipeline that embeds text."""

    output: (
        Annotated[
            str,
            Meta(
                description="The output holding one embedding a text (FP32 [-1, dim]); default: the pipeline's "
                "mean_pool output, or its only output."
            ),
        ]
        | None
    ) = None
    dimensions: Annotated[
        list[int],
        Meta(
            description="Shorter lengths the model was trained to be cut to (Matryoshka) that a request's `dimensions` "
            "may ask for (cut, then re-normalised); none: its full length only."
        ),
    ] = []

    def __post_init__(self) -> None:
        if any(d < 1 for d in self.dimensions):
            raise ValueError("dimensions must be positive lengths")
        msgspec.structs.force_setattr(self, "dimensions", sorted(set(self.dimensions)))


class PipelineSettings(Entry, frozen=True, kw_only=True):
    """Steps around a model, served under a name of their own: raw inputs in, finished outputs out."""

    name: Annotated[str, Meta(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")]
    model: Annotated[str, Meta(description="The model the steps surround.")]
    version: Annotated[str, Meta(description="Its version (default: latest).")] | None = None
    description: Annotated[str, Meta(description="Free text shown in metadata.")] = ""
    pre: Annotated[list[Step], Meta(description="Steps from the request's inputs to the model's.")] = []
    post: Annotated[list[Step], Meta(description="Steps from the model's outputs to the answer's.")] = []
    outputs: (
        Annotated[
            list[str],
            Meta(
                description="The outputs the pipeline answers with; default: every post step's, and the model's that "
                "no post step reads."
            ),
        ]
        | None
    ) = None
    cache_ttl_seconds: (
        Annotated[int, Meta(ge=1, description="Cache answers by the raw inputs for this long; off when unset.")] | None
    ) = None
    embedding: (
        Annotated[
            EmbeddingSettings,
            Meta(
                description="Served by OpenAI's embeddings API too. A pipeline whose first step is tokenize and whose "
                "last is mean_pool or pool is, without this table; the table names another output, or the "
                "Matryoshka lengths."
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_name(self.name, "name")
        check_name(self.model, "name")
        if not self.pre and not self.post:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        if self.embedding is not None:
            if not isinstance(self.pre[0] if self.pre else None, TokenizeStep):
                raise ValueError(f"pipeline {self.name!r}: an embedding pipeline's first step must be tokenize")
            ends_pooled = bool(self.post) and isinstance(self.post[-1], MeanPoolStep | PoolStep)
            one_output = self.outputs is not None and len(self.outputs) == 1
            if self.embedding.output is None and not ends_pooled and not one_output:
                raise ValueError(f"pipeline {self.name!r}: name the embedding's output (embedding.output)")
