"""InferenceService: validated, cached inference of a served model or pipeline, one request or many jobs.

Every method resolves its name to a :class:`~fnserve.core.execution.servable.Servable` and asks it the same
things, whether a model or a pipeline serves the name: there is one path for both. Its ways to run, one for each
kind of caller:

- :meth:`predict`: the offline API, outputs alone;
- :meth:`infer`: one request run whole, where nothing gathers requests (a Lambda container, a model of its own);
- :meth:`prepare`, then :meth:`finish` (or :meth:`finish_runs`, a request cut into runs): a request validated,
  looked up and staged before a gatherer holds it, and answered from its part of a batch's outputs;
- :meth:`infer_many`: separate requests of one turn, or jobs parsed one by one, each validated alone;
- :meth:`infer_columns`: a job delivery's stacks, parsed into columns, validated as one;
- :meth:`run`: a closed batch's model call (the adaptive batcher's, a pool worker's).

Whatever gathered them, the rows of several run through the :class:`~fnserve.core.execution.runner.Runner`.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from fnserve.core.codec.rows import slice_rows, take_rows
from fnserve.core.codec.tensors import pack_arrays, pack_rows, unpack_arrays
from fnserve.core.errors import (
    ConfigError,
    FnserveError,
    InferenceError,
    InvalidInput,
    ModelLoadError,
    ModelNotReady,
    unknown_model,
)
from fnserve.core.execution.cache import ResultCache, cache_key
from fnserve.core.execution.pipeline import Pipeline, Staged, concatenate
from fnserve.core.execution.runner import Runner, as_error
from fnserve.core.execution.servable import PipelineServable, Ran, Servable, in_order
from fnserve.core.execution.stacking import Failed
from fnserve.core.models.datatypes import Arrays
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.registry import Fetcher, ModelRegistry

logger = logging.getLogger(__name__)


@dataclass(slots=True)  # not frozen: a batch of jobs makes one per job, and a frozen init costs more
class Prediction:
    """A result with where it came from: the model version, and ``hit``/``miss``/``off`` for the cache.

    ``timings``: milliseconds in a pipeline's ``pre`` and ``post`` steps, when a pipeline served it.
    ``packed``: its outputs packed for a result record (:func:`~fnserve.core.codec.tensors.pack_arrays`), where the call
    that made it packed a whole stack's at once. ``device``: which device computed it, where that is worth saying
    (:class:`~fnserve.core.execution.servable.Ran`'s).
    """

    outputs: Arrays
    model: str
    version: str
    cache: str
    timings: dict[str, float] | None = None
    packed: bytes | None = None
    device: str | None = None


class Packed(Sequence[Prediction | FnserveError]):
    """The predictions of stacked jobs, by column, as :meth:`InferenceService.infer_columns` gives them to a caller
    that stores them: each job's outputs packed for its result record (:attr:`Prediction.packed`),
    and its :class:`Prediction` made only when asked for. A batch stores 10,000 jobs without making one: splitting
    the outputs per job and a prediction each cost a share of the model's run (docs/design/dataplane.md)."""

    __slots__ = ("model", "version", "packed", "cache", "hits", "failed")

    def __init__(
        self,
        model: str,
        version: str,
        packed: list[bytes],
        cache: list[str],
        hits: int,
        failed: Mapping[int, FnserveError] | None = None,
    ) -> None:
        self.model, self.version = model, version
        self.packed = packed  # a job's outputs, packed (b"" where it failed)
        self.cache = cache  # a job's cache state: hit, miss or off
        self.hits = hits
        self.failed = failed or {}  # the jobs whose run failed alone, and why

    def __len__(self) -> int:
        return len(self.packed)

    @overload
    def __getitem__(self, j: int) -> Prediction | FnserveError: ...

    @overload
    def __getitem__(self, j: slice) -> list[Prediction | FnserveError]: ...

    def __getitem__(self, j: int | slice) -> Prediction | FnserveError | list[Prediction | FnserveError]:
        if isinstance(j, slice):
            return [self[n] for n in range(*j.indices(len(self)))]
        if j in self.failed:
            return self.failed[j]
        packed = self.packed[j]
        return Prediction(unpack_arrays(packed), self.model, self.version, self.cache[j], packed=packed)


@dataclass(slots=True)  # not frozen: one per request, and a frozen init costs more
class Prepared:
    """A validated request, looked up in the cache and staged for its model: :meth:`InferenceService.finish`
    it with the model's outputs for its rows."""

    servable: Servable
    staged: Staged | None  # None: a cache hit, nothing to run (or not staged: infer runs the request whole)
    names: tuple[str, ...]
    key: str | None  # None: not cached
    hit: Arrays | None
    timings: dict[str, float] | None = None
    request: Arrays | None = None  # the validated inputs, before a pipeline's pre steps
    rows: int = 0

    @property
    def feed(self) -> Arrays:
        """What its model runs (a pipeline's: after its pre steps)."""
        assert self.staged is not None
        return self.staged.feed

    def cached(self) -> Prediction | None:
        """The cached answer, if there was one."""
        if self.hit is None:
            return None
        return Prediction(self.hit, self.servable.model.name, self.servable.model.version, "hit")


@dataclass(slots=True)
class _Stack:
    """A stack of jobs once run: the cached hits by job, and the misses' answers by job (their outputs, split or
    packed) or their own errors."""

    model: str
    version: str
    state: str  # a fresh job's cache state: "miss", or "off"
    hits: dict[int, Arrays]
    misses: Sequence[int]
    ran: list[Any] = field(default_factory=list)  # a miss's answer, or a Failed: in the order of ``misses``


class InferenceService:
    """Validated inference over a :class:`ModelRegistry`, with an optional result cache."""

    def __init__(self, registry: ModelRegistry, cache: ResultCache | None = None) -> None:
        self.registry = registry
        self.cache = cache
        self.pipelines = {p.name: p for p in registry.manifest.pipelines}
        self._built: dict[str, PipelineServable] = {}
        self._models: dict[tuple[str, str | None], Servable] = {}
        self._pipeline_lock = threading.Lock()
        self.runner = Runner()  # separate requests' and jobs' rows, stacked as they come (no padding)

    @classmethod
    def from_manifest(
        cls,
        path: str | Path,
        *,
        workers: int = 1,
        intra_op_threads: int | None = None,
        eager: bool = False,
        cache_dir: Path | None = None,
        fetchers: Mapping[str, Fetcher] | None = None,
        cache: ResultCache | None = None,
    ) -> InferenceService:
        """Build a service from a manifest file; ``eager`` loads every model now."""
        registry = ModelRegistry(
            load_manifest(path),
            workers=workers,
            intra_op_threads=intra_op_threads,
            cache_dir=cache_dir,
            fetchers=fetchers,
        )
        service = cls(registry, cache)
        if eager:
            service.load_all()
        return service

    def load_all(self) -> None:
        """Load every model and build every pipeline now (a bad tokenizer path fails here, not at a request)."""
        self.registry.load_all()
        for name in self.pipelines:
            self.servable(name)

    def servable(self, name: str, version: str | None = None) -> Servable:
        """What serves ``name`` (and ``version``): its model, or its pipeline, built on first use.

        Unknown names and versions are a :class:`ModelNotFound`; a model that cannot load, or a
        pipeline that cannot be built, a :class:`ModelNotReady`."""
        if name not in self.pipelines:
            return self._model(name, version)
        if version is not None:
            raise unknown_model(name, version, ": a pipeline has no versions")
        built = self._built.get(name)
        if built is None:
            with self._pipeline_lock:
                built = self._built.get(name)
                if built is None:
                    settings = self.pipelines[name]
                    model = self.registry.get(settings.model, settings.version)
                    try:
                        pipeline = Pipeline(settings, model, self.registry.manifest.base_dir)
                    except ConfigError as exc:  # a missing tokenizer, a step that reads nothing: not servable
                        raise ModelLoadError(f"pipeline {name!r} cannot be built: {exc.message}") from exc
                    built = self._built[name] = PipelineServable(pipeline)
        return built

    def _model(self, name: str, version: str | None) -> Servable:
        found = self._models.get((name, version))
        if found is None:  # a race makes two of the same, which is harmless
            found = self._models[(name, version)] = Servable(self.registry.get(name, version))
        return found

    # -- one request ---------------------------------------------------------------------------

    def predict(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Arrays:
        """Run a model or pipeline on a batch: validated inputs in, the requested outputs (all by default) out.

        Batches over the model's ``max_batch_size`` are run in chunks and concatenated.
        """
        return self.infer(name, inputs, version=version, outputs=outputs).outputs

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Prediction:
        """:meth:`predict`, through the result cache when the name opts in; says which version and cache: the request
        looked up as :meth:`prepare` does, then run whole (chunked, a pipeline's steps around its model) and stored."""
        looked = self._looked_up(name, inputs, version, outputs)
        if looked.hit is not None:
            return Prediction(looked.hit, looked.servable.model.name, looked.servable.model.version, "hit")
        servable, timings = looked.servable, looked.timings
        assert looked.request is not None
        result, device = servable.run(looked.request, looked.rows, looked.names, timings)
        return self._fresh(servable, looked.key, result, timings, device)

    def prepare(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Prepared:
        """Validate a request, look it up in the cache and stage it for its model: the first half of :meth:`infer`.

        For callers that run the model their own way (the adaptive batcher): a miss is run,
        then handed to :meth:`finish`, so every path caches alike.
        """
        prepared = self._looked_up(name, inputs, version, outputs)
        if prepared.hit is None:
            assert prepared.request is not None
            prepared.staged = prepared.servable.stage(prepared.request, prepared.timings)
        return prepared

    def _looked_up(
        self, name: str, inputs: Mapping[str, Any], version: str | None, outputs: Sequence[str] | None
    ) -> Prepared:
        """A request validated and looked up in the cache, not staged yet: where :meth:`infer` and :meth:`prepare`
        both start."""
        servable = self.servable(name, version)
        feed, rows = servable.validate(inputs)
        names = servable.requested(outputs)
        key, hit = self._cached_one(servable, feed, names)
        if hit is not None:
            return Prepared(servable, None, names, key, hit)
        timings: dict[str, float] | None = {} if servable.timed else None
        return Prepared(servable, None, names, key, None, timings, feed, rows)

    def finish(
        self, prepared: Prepared, outputs: Mapping[str, np.ndarray[Any, Any]], device: str | None = None
    ) -> Prediction:
        """The answer of a prepared request from its model's outputs (the requested ones kept) and the device that
        computed them, cached."""
        servable = prepared.servable
        assert prepared.staged is not None
        result = servable.finish(prepared.staged, outputs, prepared.names, prepared.timings)
        return self._fresh(servable, prepared.key, result, prepared.timings, device)

    def finish_runs(
        self, prepared: Prepared, parts: Sequence[Arrays], order: np.ndarray[Any, Any], device: str | None = None
    ) -> Prediction:
        """The answer of a prepared request run in parts (its :meth:`PipelineServable.runs`, each finished on its
        own), put back in the request's order and cached."""
        servable = prepared.servable
        result = in_order(concatenate(parts, servable.what), order)
        return self._fresh(servable, prepared.key, result, prepared.timings, device)

    def run(
        self,
        model: str,
        feed: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Ran:
        """A model's outputs (all by default) for already validated inputs, and their device: no cache, no second
        validation.

        The call of the batcher, and of a pool worker for its front process.
        """
        servable = self._model(model, version)
        batch = next(iter(feed.values())).shape[0] if feed else 0
        return servable.run(dict(feed), batch, servable.requested(outputs))

    def _cached_one(self, servable: Servable, feed: Arrays, names: Sequence[str]) -> tuple[str | None, Arrays | None]:
        """One validated request's cache key and its cached result (None, None: the servable does not cache)."""
        keys, hits = self._cached(servable, ((0, feed),), names)
        return keys.get(0), hits.get(0)

    def _fresh(
        self,
        servable: Servable,
        key: str | None,
        result: Arrays,
        timings: dict[str, float] | None = None,
        device: str | None = None,
    ) -> Prediction:
        """A fresh result as an answer, remembered under ``key`` when the servable caches."""
        model = servable.model
        if key is not None:
            self._remember(servable.ttl, {key: result})
        return Prediction(result, model.name, model.version, "off" if key is None else "miss", timings, device=device)

    # -- many jobs -----------------------------------------------------------------------------

    def infer_many(
        self,
        name: str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> list[Prediction | FnserveError]:
        """Many independent requests to one model or pipeline, vectorised: one result or error per job, in order.

        Each job is validated alone; the cache is asked once for all of them; the misses are
        stacked along the batch axis (grouped by their other dimensions) and run together in
        chunks of ``max_batch_size``; outputs are split back with a check that they split
        exactly. A stacked run that fails is run again in halves (the runner's), so one poisoned job
        cannot fail the others. Unknown names and versions raise, as for :meth:`infer`.
        """
        servable = self.servable(name, version)
        names = servable.requested(outputs)
        results: list[Prediction | FnserveError | None] = [None] * len(jobs)
        feeds: dict[int, tuple[Arrays, int]] = {}
        for i, job in enumerate(jobs):
            try:
                feeds[i] = servable.validate(job)
            except FnserveError as exc:
                results[i] = exc
        keys, hits = self._cached(servable, ((i, feed) for i, (feed, _) in feeds.items()), names)
        model, version_ = servable.model.name, servable.model.version
        for i, hit in hits.items():
            results[i] = Prediction(hit, model, version_, "hit")
            del feeds[i]
        fresh: dict[str, Arrays] = {}
        ran = self.runner.run_rows(feeds, functools.partial(_run, servable, names), servable.stackable)
        for i, outcome in ran.items():
            if isinstance(outcome, FnserveError):
                results[i] = outcome
            else:
                results[i] = Prediction(
                    outcome.outputs, model, version_, "miss" if keys else "off", device=outcome.device
                )
                if keys:
                    fresh[keys[i]] = outcome.outputs
        self._remember(servable.ttl, fresh)
        return [r if r is not None else InferenceError("job was not run") for r in results]

    def infer_columns(
        self,
        name: str,
        inputs: Mapping[str, Any],
        rows: Sequence[int],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        pack: bool = True,
    ) -> Sequence[Prediction | FnserveError]:
        """Requests already stacked along the batch axis (job ``j`` owns ``rows[j]`` rows), in one go: a prediction
        per job, or its own error.

        Validated once as a whole, looked up in the cache per job, run by the runner (a failed run
        halved down to the job at fault), split back per job. A stack that does not validate is
        refused whole: the caller validates its jobs one by one (:meth:`infer_many`). ``pack``: for
        callers that store the outputs, every job's packed in one pass over the stack, the
        predictions by column (:class:`Packed`).
        """
        stack = self._run_stack(name, inputs, rows, version, outputs, split=not pack)
        hits, misses = stack.hits, stack.misses
        if not pack:
            by_job = dict(zip(misses, stack.ran, strict=True))
            answered: list[Prediction | FnserveError] = []
            for j in range(len(rows)):
                outcome = hits[j] if j in hits else by_job[j]
                if isinstance(outcome, Failed):
                    answered.append(as_error(outcome.error))
                else:
                    answered.append(
                        Prediction(outcome, stack.model, stack.version, "hit" if j in hits else stack.state)
                    )
            return answered
        failed = {j: as_error(o.error) for j, o in zip(misses, stack.ran, strict=True) if isinstance(o, Failed)}
        fresh = [b"" if isinstance(o, Failed) else o for o in stack.ran] if failed else stack.ran
        if not hits:
            return Packed(stack.model, stack.version, fresh, [stack.state] * len(rows), 0, failed)
        by_job = dict(zip(misses, fresh, strict=True))
        packed = [by_job[j] if j in by_job else pack_arrays(hits[j]) for j in range(len(rows))]
        states = ["hit" if j in hits else stack.state for j in range(len(rows))]
        return Packed(stack.model, stack.version, packed, states, len(hits), failed)

    def _run_stack(
        self,
        name: str,
        inputs: Mapping[str, Any],
        rows: Sequence[int],
        version: str | None,
        outputs: Sequence[str] | None,
        *,
        split: bool,
    ) -> _Stack:
        """A stack validated, looked up per job, its misses run and remembered: each miss's outputs split (``split``,
        or where the cache needs them) or packed, or its own error."""
        servable = self.servable(name, version)
        names = servable.requested(outputs)
        feed, batch = servable.validate(inputs)
        if sum(rows) != batch:
            raise InvalidInput(f"stacked inputs have {batch} rows, the jobs claim {sum(rows)}")
        caching = servable.ttl is not None and self.cache is not None
        keys, hits = self._cached(servable, enumerate(slice_rows(feed, rows)), names) if caching else ({}, {})
        misses = [j for j in range(len(rows)) if j not in hits] if hits else range(len(rows))
        stack = _Stack(servable.model.name, servable.model.version, "miss" if keys else "off", hits, misses)
        if misses:
            if hits:  # run only the rows of the misses
                feed = take_rows(feed, rows, misses)
            counts = [rows[j] for j in misses] if hits else rows
            each = slice_rows if keys or split else pack_rows
            stack.ran = self.runner.run_columns(
                feed, counts, functools.partial(_run, servable, names), each, servable.what
            )
            if keys:
                ran = zip(misses, stack.ran, strict=True)
                self._remember(servable.ttl, {keys[j]: o for j, o in ran if not isinstance(o, Failed)})
                if not split:
                    stack.ran = [o if isinstance(o, Failed) else pack_arrays(o) for o in stack.ran]
        return stack

    def _remember(self, ttl: int | None, fresh: Mapping[str, Arrays]) -> None:
        """Cache fresh results by key, when the model (or pipeline) opts in."""
        if fresh and self.cache is not None and ttl is not None:
            self.cache.put_many(fresh, ttl)

    def _cached(
        self, servable: Servable, feeds: Iterable[tuple[int, Arrays]], names: Sequence[str]
    ) -> tuple[dict[int, str], dict[int, Arrays]]:
        """Cache keys of each ``(index, feed)`` and the hits among them, in one lookup; nothing if the servable is not
        cached (``feeds`` then never read)."""
        if servable.ttl is None or self.cache is None:
            return {}, {}
        keys = {i: cache_key(servable.name, servable.version_key, feed, names) for i, feed in feeds}
        if not keys:
            return {}, {}
        found = self.cache.get_many(list(keys.values()), servable.name)
        return keys, {i: found[key] for i, key in keys.items() if key in found}

    # -- metadata and readiness ---------------------------------------------------------------

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata: name, versions, platform, inputs and outputs (loads the model).

        A pipeline shows its own tensors (text in, embeddings out), not its model's, and no versions."""
        servable = self.servable(name, version)
        versions = [] if isinstance(servable, PipelineServable) else self.registry.versions(name)
        meta = servable.metadata()
        return {"name": meta.pop("name"), "versions": versions, **meta}

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Whether the model (or pipeline) can serve; loads it if needed. Unknown names raise 404."""
        try:
            self.servable(name, version)
        except ModelNotReady as exc:
            logger.warning("model not ready: %s", exc.message)
            return False
        return True

    def ready(self) -> bool:
        """Whether every model and pipeline that is loaded or loadable can serve."""
        return all(self.model_ready(name) for name in (*self.registry.names(), *self.pipelines))


def _run(servable: Servable, names: Sequence[str], feed: Arrays, rows: int) -> Ran:
    """``servable``'s run of a stack of ``rows`` rows."""
    return servable.run(feed, rows, names)
