"""InferenceService: the one object every adapter calls (predict, metadata, readiness)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from fnserve.core._rows import slice_rows, split_rows, take_rows
from fnserve.core.cache import ResultCache, cache_key
from fnserve.core.datatypes import Arrays, can_cast
from fnserve.core.errors import (
    ConfigError,
    FnserveError,
    InferenceError,
    InvalidInput,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
)
from fnserve.core.manifest import load_manifest
from fnserve.core.pipeline import Pipeline, Staged, concatenate
from fnserve.core.providers import note_device
from fnserve.core.registry import Fetcher, LoadedModel, ModelRegistry, TensorSpec, requested_outputs

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A result with where it came from: the model version, and ``hit``/``miss``/``off`` for the cache.

    ``timings``: milliseconds in a pipeline's ``pre`` and ``post`` steps, when a pipeline served it.
    """

    outputs: Arrays
    model: str
    version: str
    cache: str
    timings: dict[str, float] | None = None


@dataclass(slots=True)  # not frozen: one per request, and a frozen init costs 4x (about 0.7 µs)
class Prepared:
    """A validated request, looked up in the cache: :meth:`InferenceService.finish` it with its outputs."""

    model: LoadedModel
    feed: Arrays
    batch: int
    names: tuple[str, ...]
    key: str | None  # None: the model does not cache
    hit: Arrays | None
    pipeline: Pipeline | None = None  # a pipeline's request: its post steps still to run in finish()
    staged: Staged | None = None
    timings: dict[str, float] | None = None

    def cached(self) -> Prediction | None:
        """The cached answer, if there was one."""
        return None if self.hit is None else Prediction(self.hit, self.model.name, self.model.version, "hit")


@dataclass(frozen=True, slots=True)
class _Target:
    """What a batch of jobs runs against, a model or a pipeline: how to validate, key, run and cache it."""

    what: str  # "model 'x'" or "pipeline 'x'", for messages
    key_name: str
    key_version: str
    model: LoadedModel
    specs: tuple[TensorSpec, ...]  # inputs and outputs, for whether jobs can be stacked
    input_names: tuple[str, ...]
    ttl: int | None
    validate: Callable[[Mapping[str, Any]], tuple[Arrays, int]]
    names: Callable[[Sequence[str] | None], tuple[str, ...]]
    run: Callable[[Arrays, int, Sequence[str]], Arrays]


class InferenceService:
    """Validated inference over a :class:`ModelRegistry`, with an optional result cache."""

    def __init__(self, registry: ModelRegistry, cache: ResultCache | None = None) -> None:
        self.registry = registry
        self.cache = cache
        self.pipelines = {p.name: p for p in registry.manifest.pipelines}
        self._pipelines: dict[str, Pipeline] = {}
        self._pipeline_lock = threading.Lock()

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
            self.pipeline(name)

    def pipeline(self, name: str, version: str | None = None) -> Pipeline | None:
        """The pipeline served as ``name``, built on first use; None when ``name`` is not a pipeline's."""
        settings = self.pipelines.get(name)
        if settings is None:
            return None
        if version is not None:
            raise ModelNotFound(f"pipeline {name!r} has no versions")
        built = self._pipelines.get(name)
        if built is None:
            with self._pipeline_lock:
                built = self._pipelines.get(name)
                if built is None:
                    model = self.registry.get(settings.model, settings.version)
                    try:
                        built = Pipeline(settings, model, self.registry.manifest.base_dir)
                    except ConfigError as exc:  # a missing tokenizer, a step that reads nothing: not servable
                        raise ModelLoadError(f"pipeline {name!r} cannot be built: {exc.message}") from exc
                    self._pipelines[name] = built
        return built

    # -- inference ----------------------------------------------------------------------------

    def predict(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Arrays:
        """Run one model on a batch: validated inputs in, the requested outputs (all by default) out.

        Batches over the model's ``max_batch_size`` are run in chunks and concatenated.
        """
        return self.infer(model, inputs, version=version, outputs=outputs).outputs

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Prediction:
        """:meth:`predict`, through the result cache when the model opts in; says which version and cache."""
        pipeline = self.pipeline(model, version)
        if pipeline is not None:
            return self._infer_pipeline(pipeline, inputs, outputs)
        loaded = self.registry.get(model, version)
        feed, batch, names, key, hit = self._lookup(loaded, inputs, outputs)
        if hit is not None:
            return Prediction(hit, loaded.name, loaded.version, "hit")
        return self._store(loaded, key, _run_batched(loaded, names, feed, batch))

    def prepare(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Prepared:
        """Validate a request and look it up in the cache: the first half of :meth:`infer`.

        For callers that run the model their own way (the adaptive batcher): a miss is run,
        then handed to :meth:`finish`, so every path caches alike.
        """
        pipeline = self.pipeline(model, version)
        if pipeline is not None:
            return self._prepare_pipeline(pipeline, inputs, outputs)
        loaded = self.registry.get(model, version)
        return Prepared(loaded, *self._lookup(loaded, inputs, outputs))

    def finish(self, prepared: Prepared, outputs: Mapping[str, np.ndarray[Any, Any]]) -> Prediction:
        """The answer of a prepared request from its model's outputs (the requested ones kept), cached."""
        pipeline = prepared.pipeline
        if pipeline is None:
            return self._store(prepared.model, prepared.key, {name: outputs[name] for name in prepared.names})
        assert prepared.staged is not None
        result = pipeline.finish(prepared.staged, outputs, prepared.names, prepared.timings)
        return self._store_pipeline(pipeline, prepared.key, result, prepared.timings)

    # -- pipelines ----------------------------------------------------------------------------

    def _infer_pipeline(
        self, pipeline: Pipeline, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> Prediction:
        raw, batch, names, key, hit = self._pipeline_lookup(pipeline, inputs, outputs)
        if hit is not None:
            return Prediction(hit, pipeline.model.name, pipeline.model.version, "hit")
        timings: dict[str, float] = {}
        return self._store_pipeline(pipeline, key, self._run_pipeline(pipeline, raw, batch, names, timings), timings)

    def _prepare_pipeline(
        self, pipeline: Pipeline, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> Prepared:
        raw, batch, names, key, hit = self._pipeline_lookup(pipeline, inputs, outputs)
        if hit is not None:
            return Prepared(pipeline.model, {}, batch, names, key, hit, pipeline)
        timings: dict[str, float] = {}
        staged = pipeline.stage(raw, timings)
        feed, _ = _validate(pipeline.model, staged.feed)
        return Prepared(pipeline.model, feed, batch, names, key, None, pipeline, staged, timings)

    def _pipeline_lookup(
        self, pipeline: Pipeline, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> tuple[Arrays, int, tuple[str, ...], str | None, Arrays | None]:
        """The validated raw inputs, their batch size, the output names, and the cache key and hit
        (None, None: the pipeline does not cache)."""
        raw, batch = _validate_pipeline(pipeline, inputs)
        names = pipeline.output_names_for(outputs)
        if pipeline.settings.cache_ttl_seconds is None or self.cache is None:
            return raw, batch, names, None, None
        key = cache_key(pipeline.name, pipeline.version_key, raw, names)
        return raw, batch, names, key, self.cache.get_many([key]).get(key)

    def _store_pipeline(
        self, pipeline: Pipeline, key: str | None, result: Arrays, timings: dict[str, float] | None
    ) -> Prediction:
        model = pipeline.model
        if key is None:
            return Prediction(result, model.name, model.version, "off", timings)
        self._remember(pipeline.settings.cache_ttl_seconds, {key: result})
        return Prediction(result, model.name, model.version, "miss", timings)

    @staticmethod
    def _run_pipeline(
        pipeline: Pipeline, raw: Arrays, batch: int, names: Sequence[str], timings: dict[str, float] | None = None
    ) -> Arrays:
        """Pre steps, model, post steps, chunk by chunk of at most the model's ``max_batch_size`` rows
        (rows of like length together, then put back in order)."""
        order = pipeline.order(raw, batch)
        if order is not None:
            raw = {name: array[order] for name, array in raw.items()}
        parts = []
        for chunk in pipeline.chunks(raw, batch):
            staged = pipeline.stage(chunk, timings)
            feed, _ = _validate(pipeline.model, staged.feed)
            run = _run(pipeline.model, pipeline.model_outputs, feed)
            parts.append(pipeline.finish(staged, dict(zip(pipeline.model_outputs, run, strict=True)), names, timings))
        result = concatenate(parts, f"pipeline {pipeline.name!r}")
        if order is None:
            return result
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return {name: array[back] for name, array in result.items()}

    def _target(self, name: str, version: str | None) -> _Target:
        """A model or pipeline, as a batch of jobs runs against it."""
        pipeline = self.pipeline(name, version)
        if pipeline is not None:
            return _Target(
                f"pipeline {name!r}",
                name,
                pipeline.version_key,
                pipeline.model,
                (*pipeline.inputs, *pipeline.outputs),
                tuple(spec.name for spec in pipeline.inputs),
                pipeline.settings.cache_ttl_seconds,
                lambda inputs: _validate_pipeline(pipeline, inputs),
                pipeline.output_names_for,
                lambda feed, batch, names: self._run_pipeline(pipeline, feed, batch, names),
            )
        loaded = self.registry.get(name, version)
        return _Target(
            f"model {loaded.name!r}",
            loaded.name,
            loaded.version,
            loaded,
            (*loaded.inputs, *loaded.outputs),
            tuple(spec.name for spec in loaded.inputs),
            loaded.settings.cache_ttl_seconds,
            lambda inputs: _validate(loaded, inputs),
            lambda outputs: _output_names(loaded, outputs),
            lambda feed, batch, names: _run_batched(loaded, names, feed, batch),
        )

    def _lookup(
        self, loaded: LoadedModel, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> tuple[Arrays, int, tuple[str, ...], str | None, Arrays | None]:
        """The validated feed, its batch size, the output names, and the cache key and hit (None, None: uncached)."""
        feed, batch = _validate(loaded, inputs)
        names = _output_names(loaded, outputs)
        if loaded.settings.cache_ttl_seconds is None or self.cache is None:
            return feed, batch, names, None, None
        key = cache_key(loaded.name, loaded.version, feed, names)
        return feed, batch, names, key, self.cache.get_many([key]).get(key)

    def _store(self, loaded: LoadedModel, key: str | None, result: Arrays) -> Prediction:
        """A fresh result as an answer, remembered under ``key`` when the model caches."""
        if key is None:
            return Prediction(result, loaded.name, loaded.version, "off")
        self._remember(loaded.settings.cache_ttl_seconds, {key: result})
        return Prediction(result, loaded.name, loaded.version, "miss")

    def output_names(self, model: str, outputs: Sequence[str] | None, *, version: str | None = None) -> tuple[str, ...]:
        """The outputs a request gets (all when it names none), or the 422 for names the model lacks."""
        pipeline = self.pipeline(model, version)
        if pipeline is not None:
            return pipeline.output_names_for(outputs)
        loaded = self.registry.get(model, version)
        return _output_names(loaded, outputs)

    def run(
        self,
        model: str,
        feed: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> Arrays:
        """The outputs (all by default) for already validated inputs: no cache, no second validation.

        The call of the batcher, and of a pool worker for its front process.
        """
        loaded = self.registry.get(model, version)
        batch = next(iter(feed.values())).shape[0] if feed else 0
        return _run_batched(loaded, _output_names(loaded, outputs), dict(feed), batch)

    def infer_many(
        self,
        model: str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> list[Prediction | FnserveError]:
        """Many independent requests to one model, vectorised: one result or error per job, in order.

        Each job is validated alone; the cache is asked once for all of them; the misses are
        stacked along the batch axis (grouped by their other dimensions) and run together in
        chunks of ``max_batch_size``; outputs are split back with a check that they split
        exactly. If a stacked run fails, its jobs are run one by one, so one poisoned job
        cannot fail the others. Unknown models and versions raise, as for :meth:`infer`.
        """
        target = self._target(model, version)
        names = target.names(outputs)
        results: list[Prediction | FnserveError | None] = [None] * len(jobs)
        feeds: dict[int, tuple[Arrays, int]] = {}
        for i, job in enumerate(jobs):
            try:
                feeds[i] = target.validate(job)
            except FnserveError as exc:
                results[i] = exc
        keys, hits = self._cached({i: feed for i, (feed, _) in feeds.items()}, target, names)
        model_name, model_version = target.model.name, target.model.version
        for i, hit in hits.items():
            results[i] = Prediction(hit, model_name, model_version, "hit")
            del feeds[i]
        fresh: dict[str, Arrays] = {}
        for group in _stackable_groups(target, feeds):
            for i, outcome in _run_group(target, names, group, feeds).items():
                if isinstance(outcome, FnserveError):
                    results[i] = outcome
                else:
                    results[i] = Prediction(outcome, model_name, model_version, "miss" if keys else "off")
                    if keys:
                        fresh[keys[i]] = outcome
        self._remember(target.ttl, fresh)
        return [r if r is not None else InferenceError("job was not run") for r in results]

    def infer_stacked(
        self,
        model: str,
        inputs: Mapping[str, Any],
        rows: Sequence[int],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> list[Prediction]:
        """Requests already stacked along the batch axis (job ``j`` owns ``rows[j]`` rows), in one go.

        Validated once as a whole, looked up in the cache per job, run in chunks, split back
        per job. Any error concerns the whole stack and is raised: the caller decides whether
        to retry its jobs one by one (:meth:`infer_many`).
        """
        target = self._target(model, version)
        names = target.names(outputs)
        feed, batch = target.validate(inputs)
        if sum(rows) != batch:
            raise InvalidInput(f"stacked inputs have {batch} rows, the jobs claim {sum(rows)}")
        keys, hits = self._cached(dict(enumerate(slice_rows(feed, rows))), target, names)
        misses = [j for j in range(len(rows)) if j not in hits]
        split: dict[int, Arrays] = {}
        if misses:
            if hits:  # run only the rows of the misses
                feed = take_rows(feed, rows, misses)
            run = target.run(feed, int(sum(rows[j] for j in misses)), names)
            split = dict(zip(misses, split_rows(run, [rows[j] for j in misses], target.what), strict=True))
            self._remember(target.ttl, {keys[j]: split[j] for j in misses} if keys else {})
        state = "miss" if keys else "off"
        model_name, model_version = target.model.name, target.model.version
        return [
            Prediction(hits[j], model_name, model_version, "hit")
            if j in hits
            else Prediction(split[j], model_name, model_version, state)
            for j in range(len(rows))
        ]

    def _remember(self, ttl: int | None, fresh: Mapping[str, Arrays]) -> None:
        """Cache fresh results by key, when the model (or pipeline) opts in."""
        if fresh and self.cache is not None and ttl is not None:
            self.cache.put_many(fresh, ttl)

    def _cached(
        self, feeds: Mapping[int, Arrays], target: _Target, names: Sequence[str]
    ) -> tuple[dict[int, str], dict[int, Arrays]]:
        """Cache keys of each feed and the hits among them, in one lookup; nothing if the target is not cached."""
        if target.ttl is None or self.cache is None or not feeds:
            return {}, {}
        keys = {i: cache_key(target.key_name, target.key_version, feed, names) for i, feed in feeds.items()}
        found = self.cache.get_many(list(keys.values()))
        return keys, {i: found[key] for i, key in keys.items() if key in found}

    # -- metadata and readiness ---------------------------------------------------------------

    def model_metadata(self, model: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata: name, versions, platform, inputs and outputs (loads the model).

        A pipeline shows its own tensors (text in, embeddings out), not its model's."""
        pipeline = self.pipeline(model, version)
        if pipeline is not None:
            return {
                "name": pipeline.name,
                "versions": [],
                "platform": "fnserve_pipeline",
                "inputs": [spec.to_metadata() for spec in pipeline.inputs],
                "outputs": [spec.to_metadata() for spec in pipeline.outputs],
            }
        loaded = self.registry.get(model, version)
        return {
            "name": loaded.name,
            "versions": self.registry.versions(model),
            "platform": "onnxruntime_onnx",
            "inputs": [spec.to_metadata() for spec in loaded.inputs],
            "outputs": [spec.to_metadata() for spec in loaded.outputs],
            "parameters": loaded.placement.to_metadata(),
        }

    def model_ready(self, model: str, version: str | None = None) -> bool:
        """Whether the model (or pipeline) can serve; loads it if needed. Unknown models raise 404."""
        try:
            if self.pipeline(model, version) is None:
                self.registry.get(model, version)  # an unknown model or version: 404, raised
        except ModelNotReady as exc:
            logger.warning("model not ready: %s", exc.message)
            return False
        return True

    def ready(self) -> bool:
        """Whether every model and pipeline that is loaded or loadable can serve."""
        return all(self.model_ready(name) for name in (*self.registry.names(), *self.pipelines))


def _validate(model: LoadedModel, inputs: Mapping[str, Any]) -> tuple[Arrays, int]:
    """Check names, dtypes and shapes against the model; returns the feed and its batch size."""
    return _check(model.inputs, "model", model.name, inputs, strings=True)


def _validate_pipeline(pipeline: Pipeline, inputs: Mapping[str, Any]) -> tuple[Arrays, int]:
    """The same checks against a pipeline's own inputs; BYTES stay as sent (text or image bytes: its steps decide)."""
    return _check(pipeline.inputs, "pipeline", pipeline.name, inputs, strings=False)


def _check(
    specs: Sequence[TensorSpec], kind: str, name: str, inputs: Mapping[str, Any], *, strings: bool
) -> tuple[Arrays, int]:
    if len(inputs) != len(specs) or any(spec.name not in inputs for spec in specs):
        _raise_names(specs, kind, name, inputs)
    feed: Arrays = {}
    batch = -1
    for spec in specs:
        array = inputs[spec.name]
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        if array.dtype != spec.dtype:
            array = _cast(spec, kind, name, array)
        if strings and spec.datatype == "BYTES":
            array = _strings(spec, kind, name, array)
        shape = array.shape
        if len(shape) != len(spec.shape):
            raise InvalidInput(
                f"input {spec.name!r} of {kind} {name!r} must have rank {len(spec.shape)} "
                f"(shape {list(spec.shape)}), got shape {list(shape)}"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
            if want != -1 and want != got:
                raise InvalidInput(
                    f"input {spec.name!r} of {kind} {name!r} must have {want} at axis {axis} "
                    f"(shape {list(spec.shape)}), got shape {list(shape)}"
                )
        if shape and spec.shape[0] == -1:
            if shape[0] == 0:
                raise InvalidInput(f"input {spec.name!r} of {kind} {name!r} is an empty batch")
            if batch == -1:
                batch = shape[0]
            elif shape[0] != batch:
                raise InvalidInput(
                    f"inputs of {kind} {name!r} disagree on the batch size: "
                    f"{spec.name!r} has {shape[0]}, another input has {batch}"
                )
        feed[spec.name] = array
    return feed, batch


def _raise_names(specs: Sequence[TensorSpec], kind: str, name: str, inputs: Mapping[str, Any]) -> None:
    expected = [spec.name for spec in specs]
    missing = [n for n in expected if n not in inputs]
    extra = sorted(str(n) for n in inputs if n not in expected)
    parts = []
    if missing:
        parts.append(f"missing inputs {missing}")
    if extra:
        parts.append(f"unexpected inputs {extra}")
    raise InvalidInput(f"{kind} {name!r} takes inputs {expected}: {'; '.join(parts)}")


def _cast(spec: TensorSpec, kind: str, name: str, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if not can_cast(array.dtype, spec.dtype):
        raise InvalidInput(
            f"input {spec.name!r} of {kind} {name!r} must be {spec.datatype} "
            f"({spec.dtype}); {array.dtype} cannot be cast to it safely"
        )
    return array.astype(spec.dtype)


def _strings(spec: TensorSpec, kind: str, name: str, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # ONNX Runtime takes string tensors as str objects (it would str() a bytes object into "b'..'").
    out = np.empty(array.shape, dtype=object)
    try:
        out.ravel()[:] = [v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()]
    except UnicodeDecodeError:
        raise InvalidInput(f"input {spec.name!r} of {kind} {name!r}: BYTES elements must be UTF-8") from None
    return out


def _output_names(model: LoadedModel, outputs: Sequence[str] | None) -> tuple[str, ...]:
    if outputs is None:
        return model.output_names
    return requested_outputs("model", model.name, model.output_names, model.output_set, outputs)


def _run_batched(model: LoadedModel, names: Sequence[str], feed: Arrays, batch: int) -> Arrays:
    limit = model.settings.max_batch_size
    if batch <= limit:
        results = _run(model, names, feed)
    else:
        chunks = [
            _run(model, names, {k: v[start : start + limit] for k, v in feed.items()})
            for start in range(0, batch, limit)
        ]
        results = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
    return dict(zip(names, results, strict=True))


def _stackable_groups(target: _Target, feeds: Mapping[int, tuple[Arrays, int]]) -> list[list[int]]:
    """Jobs that can share one runtime call: same non-batch dimensions, every input and output batched.

    An output whose first dimension the graph fixes (a reduction over the batch, say) could not
    be split back by rows, even where its length happens to equal the stacked rows.
    """
    if not all(spec.shape and spec.shape[0] == -1 for spec in target.specs):
        return [[i] for i in feeds]
    groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for i, (feed, _) in feeds.items():
        groups.setdefault(tuple(feed[name].shape[1:] for name in target.input_names), []).append(i)
    return list(groups.values())


def _run_group(
    target: _Target, names: Sequence[str], group: list[int], feeds: Mapping[int, tuple[Arrays, int]]
) -> dict[int, Arrays | FnserveError]:
    sizes = [feeds[i][1] for i in group]
    if len(group) > 1:
        stacked = {name: np.concatenate([feeds[i][0][name] for i in group]) for name in target.input_names}
        try:
            outputs = target.run(stacked, sum(sizes), names)
            return dict(zip(group, split_rows(outputs, sizes, target.what), strict=True))
        except FnserveError:
            logger.warning("a stacked batch of %s failed; running its %d jobs one by one", target.what, len(group))
    results: dict[int, Arrays | FnserveError] = {}
    for i in group:
        try:
            results[i] = target.run(*feeds[i], names)
        except FnserveError as exc:
            results[i] = exc
    return results


def _run(model: LoadedModel, names: Sequence[str], feed: Arrays) -> list[np.ndarray[Any, Any]]:
    if model.placement.device != "cpu":
        note_device(model.placement.device)
    try:
        return model.session.run(names, feed)
    except InvalidArgument as exc:
        # Shapes ONNX Runtime itself refuses (a dimension the graph constrains internally).
        raise InvalidInput(f"model {model.name!r} rejected the input: {exc}") from exc
    except FnserveError:
        raise
    except Exception as exc:
        logger.exception("inference failed in model %r", model.name)
        raise InferenceError(f"inference failed in model {model.name!r}") from exc
