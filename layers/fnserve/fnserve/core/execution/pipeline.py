"""Pipelines: steps around a model, served under their own name like a model.

A pipeline's inputs are what its pre steps read that no earlier step made, and the model's
inputs that no pre step makes (they pass through). Its outputs are what its post steps make
and the model's outputs that no post step reads, or the list its manifest entry gives. Post
steps see every tensor of the request: the model's outputs, and what the pre steps made (the
attention mask a pooling step needs, say).

Rows stay independent through every step, so a pipeline runs any slice of a batch: a batch
over the model's ``max_batch_size`` runs chunk by chunk (each chunk tokenized, run and pooled
on its own, padded only to its own longest text), and a batcher can gather the model feeds
of many requests and hand each its rows back for its post steps.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from fnserve.core.errors import ConfigError, InferenceError
from fnserve.core.execution.steps import Step, Tokenize, build_step, run_step
from fnserve.core.models.datatypes import Arrays
from fnserve.core.models.manifest.pipelines import PipelineSettings
from fnserve.core.models.registry import LoadedModel, TensorSpec, requested_outputs


@dataclass(slots=True)
class Staged:
    """A request between its pre and post steps: the model's feed, and every tensor the post steps may read."""

    feed: Arrays
    context: Arrays


class Pipeline:
    """A pipeline of the manifest around its loaded model: its own tensors, and its steps ready to run."""

    def __init__(self, settings: PipelineSettings, model: LoadedModel, base_dir: Path) -> None:
        self.settings = settings
        self.model = model
        self.name = settings.name
        self.pre: list[Step] = [build_step(s, model, base_dir) for s in settings.pre]
        self.post: list[Step] = [build_step(s, model, base_dir) for s in settings.post]
        self.inputs = self._inputs()
        self.outputs, self.model_outputs = self._outputs()
        self.output_names = tuple(spec.name for spec in self.outputs)
        # What a request may ask for besides: the tensors the pre steps made that the model does not take (the
        # tokens each text ran), never answered unasked.
        fed = {spec.name for spec in model.inputs}
        extras = {spec.name for step in self.pre for spec in step.writes if spec.name not in fed}
        self.output_set = frozenset(self.output_names) | extras
        digest = hashlib.sha256(msgspec.json.encode(settings))
        digest.update(model.settings.sha256.encode())
        for step in (*self.pre, *self.post):
            digest.update(step.digest.encode())
        # The cache's "version" of a pipeline: its model's version and everything that decides its answers.
        self.version_key = f"{model.version}+{digest.hexdigest()[:16]}"
        # The model inputs its first step tokenizes into, if it does: then a batch's texts are cut by their token
        # counts, each chunk those inputs padded only to its own longest text.
        first = self.pre[0] if self.pre else None
        self.token_inputs: tuple[str, ...] = tuple(first.outputs) if isinstance(first, Tokenize) else ()
        self.tokenizes = bool(self.token_inputs)

    def _inputs(self) -> tuple[TensorSpec, ...]:
        made: set[str] = set()
        inputs: dict[str, TensorSpec] = {}
        for step in self.pre:
            for spec in step.reads:
                if spec.name not in made:
                    inputs.setdefault(spec.name, spec)
            made.update(spec.name for spec in step.writes)
        for spec in self.model.inputs:
            if spec.name not in made:
                inputs.setdefault(spec.name, spec)  # passes through to the model
        return tuple(inputs.values())

    def _outputs(self) -> tuple[tuple[TensorSpec, ...], tuple[str, ...]]:
        available: dict[str, TensorSpec] = {spec.name: spec for spec in self.inputs}
        for step in self.pre:
            available.update((spec.name, spec) for spec in step.writes)
        model_outputs = {spec.name: spec for spec in self.model.outputs}
        available.update(model_outputs)
        read: set[str] = set()
        made: dict[str, TensorSpec] = {}
        for step in self.post:
            for spec in step.reads:
                if spec.name not in available:
                    raise ConfigError(
                        f"pipeline {self.name!r}: step {step.name} reads {spec.name!r}, which neither the model "
                        f"{self.model.name!r} nor an earlier step provides"
                    )
                read.add(spec.name)
            for spec in step.writes:
                available[spec.name] = made[spec.name] = spec
        if self.settings.outputs is not None:
            unknown = [name for name in self.settings.outputs if name not in available]
            if unknown:
                raise ConfigError(f"pipeline {self.name!r}: outputs {unknown} are made by neither a step nor the model")
            outputs = tuple(available[name] for name in self.settings.outputs)
        else:
            outputs = tuple(spec for name, spec in model_outputs.items() if name not in read) + tuple(made.values())
        wanted = read | {spec.name for spec in outputs}
        return outputs, tuple(name for name in model_outputs if name in wanted)

    # -- running --------------------------------------------------------------------------------

    def output_names_for(self, outputs: Sequence[str] | None) -> tuple[str, ...]:
        """The outputs a request gets (all when it names none), or the 422 for names the pipeline lacks."""
        return requested_outputs("pipeline", self.name, self.output_names, self.output_set, outputs)

    def stage(self, inputs: Mapping[str, np.ndarray[Any, Any]], timings: dict[str, float] | None = None) -> Staged:
        """The pre steps over validated pipeline inputs: the model's feed, and the tensors kept for the post steps."""
        started = time.perf_counter()
        tensors: Arrays = dict(inputs)
        for step in self.pre:
            tensors.update(run_step(step, tensors))
        feed = {spec.name: tensors[spec.name] for spec in self.model.inputs}
        if timings is not None:
            timings["pre"] = timings.get("pre", 0.0) + (time.perf_counter() - started) * 1e3
        return Staged(feed, tensors)

    def finish(
        self,
        staged: Staged,
        outputs: Mapping[str, np.ndarray[Any, Any]],
        names: Sequence[str],
        timings: dict[str, float] | None = None,
    ) -> Arrays:
        """The post steps over the model's outputs: the requested outputs of the pipeline."""
        started = time.perf_counter()
        tensors: Arrays = {**staged.context, **outputs}
        for step in self.post:
            tensors.update(run_step(step, tensors))
        if timings is not None:
            timings["post"] = timings.get("post", 0.0) + (time.perf_counter() - started) * 1e3
        return {name: tensors[name] for name in names}

    def order(self, inputs: Arrays, batch: int) -> np.ndarray[Any, Any] | None:
        """The order to run a batch over the model's ``max_batch_size`` in: rows of like length
        together (texts sorted by length, so each chunk pads to little more than its own rows), or
        None to run it as it comes."""
        if batch <= self.model.settings.max_batch_size or not self.pre:
            return None
        key = self.pre[0].sort_key(inputs)
        return None if key is None else np.argsort(key, kind="stable")

    def chunks(self, inputs: Arrays, batch: int) -> list[Arrays]:
        """The inputs in slices of at most the model's ``max_batch_size`` rows (views)."""
        limit = self.model.settings.max_batch_size
        if batch <= limit:
            return [inputs]
        return [{k: v[start : start + limit] for k, v in inputs.items()} for start in range(0, batch, limit)]


def concatenate(parts: Sequence[Arrays], what: str) -> Arrays:
    """The outputs of a batch's chunks as one, row after row; outputs whose other dimensions vary
    between chunks (token embeddings of chunks padded to different lengths) are padded with zeros."""
    if len(parts) == 1:
        return parts[0]
    joined: Arrays = {}
    for name in parts[0]:
        arrays = [part[name] for part in parts]
        if len({a.shape[1:] for a in arrays}) > 1:
            if len({a.ndim for a in arrays}) > 1:
                raise InferenceError(f"{what}: output {name!r} changes rank between chunks")
            widest = np.max([a.shape[1:] for a in arrays], axis=0)
            arrays = [
                np.pad(a, [(0, 0), *((0, int(w - d)) for w, d in zip(widest, a.shape[1:], strict=True))])
                for a in arrays
            ]
        joined[name] = np.concatenate(arrays)
    return joined
