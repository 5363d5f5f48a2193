"""Text embeddings as OpenAI's embeddings API asks for them: which pipelines embed text, a text given as its
token ids, the tokens each text ran, and an embedding cut to fewer dimensions (Matryoshka).

A pipeline embeds text when its first step is ``tokenize`` and its last ``mean_pool`` or ``pool`` (or its manifest entry
has an ``embedding`` table naming the output). The tokenize step writes, beside the model's feed, how many tokens each
row ran (:data:`TOKENS`) and whether it was cut to the tokenizer's ``max_length`` (:data:`TRUNCATED`): a request may ask
a pipeline for them as outputs, so usage is counted by the tokenizer that ran, in the same call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fnserve.core.errors import InvalidInput
from fnserve.core.models.manifest.loading import Manifest
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.manifest.pipelines import PipelineSettings
from fnserve.core.models.manifest.steps import MeanPoolStep, PoolStep, TokenizeStep

TOKENS = "token_count"  # INT64 [-1]: the tokens each row ran, special tokens included
# A batch of texts, cut by its padded tokens, holds at least this share of real ones: a padded token costs the
# model as much as a real one (the adaptive batcher's rule, and a stacked batch's).
MIN_FILL = 0.8
TRUNCATED = "truncated"  # BOOL [-1]: whether the row was cut to max_length
MAX_REQUEST_TOKENS = 300_000  # OpenAI's own bound on the tokens of one embeddings request, on every route here


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """What one run of a text model may hold: at most ``tokens`` padded tokens (its longest length times its rows)
    and ``attention`` rows times its longest length squared (the scores each attention head computes), each where
    set. Past the CPU's cache a run of several long texts costs more a text than runs of fewer."""

    tokens: int | None = None
    attention: int | None = None

    @classmethod
    def of(cls, settings: ModelSettings) -> TokenBudget | None:
        """The budget a model's manifest entry sets (None: none)."""
        if settings.max_batch_tokens is None and settings.max_batch_attention is None:
            return None
        return cls(settings.max_batch_tokens, settings.max_batch_attention)

    def rows(self, limit: int, longest: int) -> int:
        """The most rows padded to ``longest`` that a run holds, at least one and at most ``limit``."""
        fits = limit
        if self.tokens is not None and longest:
            fits = min(fits, self.tokens // longest)
        if self.attention is not None and longest:
            fits = min(fits, self.attention // (longest * longest))
        return max(1, fits)

    def holds(self, rows: int, longest: int) -> bool:
        """Whether a run of ``rows`` padded to ``longest`` is within the budget."""
        return (self.tokens is None or longest * rows <= self.tokens) and (
            self.attention is None or rows * longest * longest <= self.attention
        )


def filled(real: int, rows: int, longest: int) -> bool:
    """Whether ``real`` tokens are at least ``MIN_FILL`` of ``rows`` padded to ``longest``."""
    return real >= MIN_FILL * longest * rows


def token_runs(lengths: Sequence[int], budget: TokenBudget | None, max_rows: int) -> list[int]:
    """Texts sorted by their token ``lengths`` (ascending) cut into runs, greedily: a run takes the next text while
    ``budget`` holds it (None: no bound but the rows), it has fewer than ``max_rows`` rows, and at least ``MIN_FILL``
    of its padded tokens stay real. The index after each run's last text."""
    ends: list[int] = []
    start = 0
    while start < len(lengths):
        end, real = start + 1, lengths[start]
        while end < len(lengths) and end - start < max_rows:
            length, taken = lengths[end], end + 1 - start
            if (budget is not None and not budget.holds(taken, length)) or not filled(real + length, taken, length):
                break
            real += length
            end += 1
        ends.append(end)
        start = end
    return ends


class TokenIds(tuple[int, ...]):
    """A text given as its token ids (the model's own, special tokens included), in place of the text: the tokenize
    step runs them as they are. Only a codec makes them (OpenAI's arrays of token ids); V2 carries text only."""

    __slots__ = ()


class Prompted(str):
    """A text with the prompt a request named already put before it: the tokenize step puts its default prompt
    before every other text, never before this one."""

    __slots__ = ()


def prompted(texts: np.ndarray[Any, Any], prompts: dict[str, str], name: object, what: str) -> np.ndarray[Any, Any]:
    """``texts`` with the prompt called ``name`` put before each (token ids run as they are); None: as they are,
    for the tokenize step's default prompt. An unknown name is the client's 4xx, naming ``what`` is asked."""
    if name is None:
        return texts
    if not isinstance(name, str) or name not in prompts:
        known = ", ".join(map(repr, sorted(prompts))) or "none"
        raise InvalidInput(f"prompt_name {name!r} is not one of {what}'s prompts ({known})")
    prompt = prompts[name]
    out = np.empty(len(texts), dtype=object)
    for i, text in enumerate(texts.tolist()):
        out[i] = text if isinstance(text, TokenIds) else Prompted(prompt + text)
    return out


@dataclass(frozen=True, slots=True)
class Embedder:
    """A pipeline served as an embedding model: the input that takes texts, the output of one embedding a text,
    the shorter lengths it may be cut to, and the prompts a request may name."""

    name: str
    text: str
    output: str
    dimensions: tuple[int, ...]
    prompts: dict[str, str] = field(default_factory=dict)

    @property
    def outputs(self) -> tuple[str, str, str]:
        """What an embedding request asks the pipeline for: the embeddings, the tokens ran, the rows truncated."""
        return (self.output, TOKENS, TRUNCATED)


def embedding_output(pipeline: PipelineSettings) -> str | None:
    """The output of one embedding a text, where ``pipeline`` embeds text (else None)."""
    if not pipeline.pre or not isinstance(pipeline.pre[0], TokenizeStep):
        return None
    table = pipeline.embedding
    if table is not None and table.output is not None:
        return table.output
    if pipeline.post and isinstance(pipeline.post[-1], MeanPoolStep | PoolStep):
        return pipeline.post[-1].output
    if table is not None and pipeline.outputs is not None and len(pipeline.outputs) == 1:
        return pipeline.outputs[0]
    return None


def embedders(manifest: Manifest) -> dict[str, Embedder]:
    """Every pipeline of ``manifest`` that embeds text, by name, in the manifest's order."""
    found: dict[str, Embedder] = {}
    for pipeline in manifest.pipelines:
        output = embedding_output(pipeline)
        if output is None:
            continue
        tokenize = pipeline.pre[0]
        assert isinstance(tokenize, TokenizeStep)
        lengths = tuple(pipeline.embedding.dimensions) if pipeline.embedding is not None else ()
        found[pipeline.name] = Embedder(pipeline.name, tokenize.input, output, lengths, dict(tokenize.prompts))
    return found


def cut_length(embedder: Embedder, service: Any, asked: Any) -> int:
    """A request's ``dimensions`` for ``embedder`` (served by ``service``): its full length, or one the model was
    trained to be cut to (Matryoshka); any other is the client's :class:`InvalidInput`."""
    if type(asked) is not int or asked < 1:
        raise InvalidInput(f"dimensions must be a positive integer, got {asked!r}")
    spec = next(s for s in service.servable(embedder.name).outputs if s.name == embedder.output)
    full = spec.shape[-1]
    if asked == full or asked in embedder.dimensions:
        return int(asked)
    lengths = ", ".join(map(str, [*embedder.dimensions, full]))
    raise InvalidInput(f"model {embedder.name!r} does not support dimensions={asked}: it gives {lengths}")


def shorten(vectors: np.ndarray[Any, Any], size: int) -> np.ndarray[Any, Any]:
    """The first ``size`` values of each embedding, scaled back to unit length, as Matryoshka models are used."""
    cut: np.ndarray[Any, Any] = vectors[:, :size]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)  # type: ignore[no-any-return]
