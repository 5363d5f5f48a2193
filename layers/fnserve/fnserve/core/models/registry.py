"""Model registry: manifest entries -> warm ONNX Runtime sessions, loaded once per process."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import onnxruntime as ort

from fnserve.core.errors import InvalidInput, ModelLoadError, unknown_model
from fnserve.core.host import available_cpus, default_intra_op_threads
from fnserve.core.models import external
from fnserve.core.models.datatypes import ORT_TO_V2, V2_TO_NUMPY
from fnserve.core.models.manifest.loading import Manifest
from fnserve.core.models.manifest.models import ModelSettings, TensorOverride
from fnserve.core.models.providers import (
    CPU,
    GPU_PROVIDERS,
    Placement,
    check,
    cuda_graphs,
    name_of,
    ort_providers,
    requested,
)
from fnserve.core.models.shape_sessions import GraphSession, ShapeSessions, shape_key
from fnserve.core.models.statistics import Executions

logger = logging.getLogger(__name__)

# A fetcher turns a remote model's file (its graph, or a data file beside it) into a local file (the AWS adapter
# registers "s3").
Fetcher = Callable[[str, Path], Path]

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a model, as the graph (and manifest overrides) declare it."""

    name: str
    datatype: str  # V2 name: FP32, INT64, ...
    dtype: np.dtype[np.generic]
    shape: tuple[int, ...]  # -1 where the dimension varies

    def to_metadata(self) -> dict[str, object]:
        """The V2 metadata form: name, datatype, shape."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class Session(Protocol):
    """What inference needs of a session: an ONNX Runtime one, or one in a worker process
    (:class:`~fnserve.workers.remote.PoolSession`)."""

    def run(self, output_names: Sequence[str], input_feed: Mapping[str, Any]) -> list[Any]: ...

    def get_providers(self) -> list[str]: ...


@dataclass(frozen=True, slots=True, eq=False)
class LoadedModel:
    """A model version with its warm session and its tensor specs."""

    settings: ModelSettings
    session: Session
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    output_names: tuple[str, ...]
    output_set: frozenset[str]
    path: Path
    placement: Placement = Placement((CPU,), "cpu")
    load_seconds: float = 0.0  # fetch, check, session(s) and warm-up: what a cold start pays for this model
    executions: Executions = field(default_factory=Executions)  # its runs in this process (statistics)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str:
        return self.settings.version


def session_options(settings: ModelSettings, threads: int) -> ort.SessionOptions:
    """ONNX Runtime's options for a session of the model ``settings`` describe, with ``threads`` intra-op threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = _OPT_LEVELS[settings.graph_optimization]
    return options


def requested_outputs(
    kind: str, name: str, output_names: tuple[str, ...], output_set: frozenset[str], outputs: Sequence[str] | None
) -> tuple[str, ...]:
    """The outputs a request gets from a model or pipeline (all when it names none, each once), or the
    422 for names it lacks."""
    if not outputs:
        return output_names
    unknown = [o for o in outputs if o not in output_set]
    if unknown:
        raise InvalidInput(f"{kind} {name!r} has no outputs {unknown}; it has {list(output_names)}")
    return tuple(dict.fromkeys(outputs))


def _version_key(version: str) -> tuple[int, int, str]:
    # Numeric versions compare as numbers and above any non-numeric label.
    return (1, int(version), "") if version.isdigit() else (0, 0, version)


class ModelRegistry:
    """Every model of a manifest; sessions are created lazily (or eagerly) and kept for the process."""

    in_process: ClassVar[bool] = True  # whether inference runs in this process (no waiting on another)

    def __init__(
        self,
        manifest: Manifest,
        *,
        workers: int = 1,
        intra_op_threads: int | None = None,
        cache_dir: Path | None = None,
        fetchers: Mapping[str, Fetcher] | None = None,
        cpu_only: bool = False,
    ) -> None:
        self.manifest = manifest
        self.cpu_only = cpu_only  # every model on its CPU providers alone (a mixed pool's CPU workers)
        self._threads = intra_op_threads or default_intra_op_threads(workers)
        self._cache_dir = cache_dir
        self._fetchers = dict(fetchers or {})
        self._entries: dict[tuple[str, str], ModelSettings] = {}
        self._versions: dict[str, list[str]] = {}
        for model in manifest.models:
            self._entries[(model.name, model.version)] = model
            self._versions.setdefault(model.name, []).append(model.version)
        self._default: dict[str, str] = {}
        for name, versions in self._versions.items():
            versions.sort(key=_version_key)
            self._default[name] = versions[-1]
        self._loaded: dict[tuple[str, str | None], LoadedModel] = {}
        # Each version's runs, counted across its loads (the statistics ask before a lazy model loads).
        self.executions = {key: Executions() for key in self._entries}
        self._locks: dict[tuple[str, str], threading.Lock] = {k: threading.Lock() for k in self._entries}

    # -- lookup -------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Model names, in manifest order."""
        return list(self._versions)

    def versions(self, name: str) -> list[str]:
        """Versions of a model, oldest first; 404 if the model is unknown."""
        try:
            return list(self._versions[name])
        except KeyError:
            raise unknown_model(name) from None

    def resolve(self, name: str, version: str | None = None) -> ModelSettings:
        """The manifest entry for a model version (the default version when None)."""
        if version is None:
            try:
                version = self._default[name]
            except KeyError:
                raise unknown_model(name) from None
        try:
            return self._entries[(name, version)]
        except KeyError:
            if name not in self._versions:
                raise unknown_model(name) from None
            raise unknown_model(name, version, f"; available: {', '.join(self._versions[name])}") from None

    def is_loaded(self, name: str, version: str | None = None) -> bool:
        """Whether the session of this model version exists already."""
        settings = self.resolve(name, version)
        return (settings.name, settings.version) in self._loaded

    # -- loading ------------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """The loaded model, loading it on first use. Thread-safe; loads each model once."""
        model = self._loaded.get((name, version))
        if model is not None:
            return model
        settings = self.resolve(name, version)
        key = (settings.name, settings.version)
        with self._locks[key]:
            model = self._loaded.get(key)
            if model is None:
                model = self._load(settings)
                self._loaded[key] = model
                if version is None or version == self._default[name]:
                    self._loaded[(name, None)] = model
        return model

    def load_all(self) -> None:
        """Load every model now (eager mode); raises the first load error, in the manifest's order.

        On the CPU the models load in parallel, one thread a CPU: ONNX Runtime builds a session without holding
        the GIL, so a start with several models takes about its largest model's time. Where a model may go to a
        GPU they load one at a time: engine builds at once would compete for its memory.
        """
        entries = list(self._entries)
        threads = 1 if self._may_use_gpu() else min(len(entries), available_cpus())
        if threads <= 1:
            for name, version in entries:
                self.get(name, version)
            return
        with ThreadPoolExecutor(threads, thread_name_prefix="fnserve-load") as pool:
            loads = [pool.submit(self.get, name, version) for name, version in entries]
            wait(loads, return_when=FIRST_EXCEPTION)
            for load in loads:
                load.cancel()  # the start stops at the first error: no need for the rest
        for load in loads:
            if not load.cancelled():
                load.result()

    def _may_use_gpu(self) -> bool:
        """Whether a model asks for a GPU provider that this build of ONNX Runtime has."""
        available = set(ort.get_available_providers()) & GPU_PROVIDERS
        return any(
            name_of(provider) in available
            for settings in self._entries.values()
            for provider in requested(settings, self.cpu_only)
        )

    def warm_all(self) -> None:
        """Load every model and run each once on zeros, whatever its ``warmup`` setting.

        For a process about to be copied (SnapStart's snapshot): every copy then starts with
        the sessions built and their allocators and kernels warmed.
        """
        for name, version in self._entries:
            model = self.get(name, version)
            where = f"model {name!r} version {version!r}"
            warm_up(model.session, model.settings, model.inputs, model.output_names, model.placement, where)

    def _load(self, settings: ModelSettings) -> LoadedModel:
        where = f"model {settings.name!r} version {settings.version!r}"
        began = time.perf_counter()
        path = self._local_path(settings)
        data = _checked_bytes(path, settings.sha256, where)
        weights = {
            name: _checked_bytes(path.parent / name, digest, where) for name, digest in settings.external_data.items()
        }
        options = session_options(settings, settings.intra_op_threads or self._threads)
        external.hand_over(options, weights)
        providers, fallback = ort_providers(settings, where, self.cpu_only)

        def create() -> Any:
            try:
                # Loading from the verified bytes, not the paths, so no file can change in between.
                made = ort.InferenceSession(data, sess_options=options, providers=providers)
            except Exception as exc:  # ORT raises its own pybind exception types
                missing = external.unlisted(exc)
                if missing is not None:
                    raise ModelLoadError(
                        f"{where}: its graph keeps tensors in {missing!r} beside {path.name}, which the manifest does "
                        "not list: name it under external_data with its sha256 (`fnserve manifest add` does)"
                    ) from exc
                raise ModelLoadError(f"{where}: {path} cannot be loaded: {exc}") from exc
            if weights:
                # ORT remakes a session whose provider fails in a run from these options, whose data files' bytes
                # are gone by then: the run fails instead.
                made.disable_fallback()
            return made

        first = create()
        placement = check(first, settings, where, fallback, self.cpu_only)
        inputs = tensor_specs(first.get_inputs(), settings.inputs, where, "input")
        outputs = tensor_specs(first.get_outputs(), settings.outputs, where, "output")
        session: Session = first
        shaped = ""
        if settings.session_per_shape or cuda_graphs(settings, placement):
            names = [spec.name for spec in inputs]
            # Distinct: a length bucket changes no shape when no input is padded to it.
            keys = list(
                dict.fromkeys(
                    shape_key(zeros_feed(inputs, rows, length, settings.pad_inputs), names)
                    for rows, length in batch_shapes(settings)
                )
            )
            if settings.session_per_shape:
                session = ShapeSessions({key: first if i == 0 else create() for i, key in enumerate(keys)}, first)
                shaped = f", {len(keys)} sessions, one per shape"
            else:
                device, _, device_id = placement.device.partition(":")
                session = GraphSession(first, keys, device, int(device_id or 0))
                shaped = f", a CUDA graph per shape ({len(keys)})"
        weights.clear()  # every session holds its own copy: the data files' bytes go before the warm-up runs
        if settings.warmup:
            warm_up(session, settings, inputs, [o.name for o in outputs], placement, where)
        seconds = time.perf_counter() - began
        logger.info(
            "loaded %s from %s in %.2f s (%d threads, providers %s, device %s%s)%s",
            where,
            path,
            seconds,
            options.intra_op_num_threads,
            list(placement.providers),
            placement.device,
            shaped,
            f"; CPU FALL BACK: {placement.fallback}" if placement.fallback else "",
        )
        return LoadedModel(
            settings=settings,
            session=session,
            inputs=inputs,
            outputs=outputs,
            output_names=tuple(o.name for o in outputs),
            output_set=frozenset(o.name for o in outputs),
            path=path,
            placement=placement,
            load_seconds=seconds,
            executions=self.executions[(settings.name, settings.version)],
        )

    def _local_path(self, settings: ModelSettings) -> Path:
        scheme, sep, _ = settings.path.partition("://")
        if not sep:
            path = Path(settings.path)
            return path if path.is_absolute() else self.manifest.base_dir / path
        fetcher = self._fetchers.get(scheme)
        if fetcher is None:
            raise ModelLoadError(
                f"model {settings.name!r}: no fetcher for {scheme}:// paths "
                "(install fnserve[aws] and use fnserve.aws for s3://)"
            )
        cache_dir = self._cache_dir or Path("/tmp/fnserve-models")
        target = cache_dir / settings.name / settings.version / "model.onnx"
        # Its data files beside it, by the names its graph gives them, as in the bucket.
        files = [(settings.path, target)]
        files += [(external.beside(settings.path, name), target.parent / name) for name in settings.external_data]
        for uri, local in files:
            if local.exists():
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                fetcher(uri, local)
            except Exception as exc:
                raise ModelLoadError(f"model {settings.name!r}: cannot fetch {uri}: {exc}") from exc
        return target


def _checked_bytes(path: Path, sha256: str, where: str) -> bytes:
    """The bytes of ``path`` (the graph, or one of its data files) if they have the manifest's ``sha256``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ModelLoadError(f"{where}: file {path} does not exist") from None
    except OSError as exc:
        raise ModelLoadError(f"{where}: file {path} cannot be read: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ModelLoadError(f"{where}: file {path} has sha256 {digest}, but the manifest says {sha256}")
    return data


def zeros_feed(
    inputs: Sequence[TensorSpec], rows: int = 1, length: int = 1, padded: Collection[str] = ()
) -> dict[str, np.ndarray[Any, Any]]:
    """Zeros (empty strings for BYTES) for each input: ``rows`` along a free first dimension, ``length`` along
    axis 1 of the ``padded`` inputs, 1 for every other free dimension."""
    feed = {}
    for spec in inputs:
        shape = [1 if d == -1 else d for d in spec.shape]
        if spec.shape and spec.shape[0] == -1:
            shape[0] = rows
        if spec.name in padded and len(spec.shape) > 1 and spec.shape[1] == -1:
            shape[1] = length
        feed[spec.name] = np.full(shape, b"" if spec.datatype == "BYTES" else 0, dtype=spec.dtype)
    return feed


# A GPU model is warmed at every batch size the batcher can form; past this many, at powers of two only.
MAX_WARM_SIZES = 64


def warm_shapes(settings: ModelSettings, placement: Placement) -> list[tuple[int, int]]:
    """(rows, length) of every warm-up run: one on a CPU; on a GPU, or with a session per shape, every shape
    of :func:`batch_shapes`, so that no request pays for cuDNN's algorithm search, a TensorRT engine build,
    a CUDA graph's capture or a fresh session's first run."""
    if placement.device == "cpu" and not settings.session_per_shape:
        return [(1, 1)]
    return batch_shapes(settings)


def batch_shapes(settings: ModelSettings) -> list[tuple[int, int]]:
    """(rows, length) of every batch the batcher can form: each batch size (its ``batch_buckets``, else 1 to
    ``max_batch_size``, or powers of two past :data:`MAX_WARM_SIZES` of them) at each length bucket."""
    sizes = settings.batch_buckets or list(range(1, settings.max_batch_size + 1))
    if len(sizes) > MAX_WARM_SIZES:
        sizes = sorted({*(2**i for i in range(settings.max_batch_size.bit_length())), settings.max_batch_size})
        logger.warning(
            "model %r: %d batch sizes are too many to warm; warming %s (set batch_buckets to pad batches to these)",
            settings.name,
            settings.max_batch_size,
            sizes,
        )
    lengths = settings.length_buckets or [1]
    return [(rows, length) for rows in sizes for length in lengths]


def warm_up(
    session: Session,
    settings: ModelSettings,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[str],
    placement: Placement,
    where: str,
) -> None:
    """Run the session on zeros at each of :func:`warm_shapes`' shapes (a model that rejects zeros still serves)."""
    shapes = warm_shapes(settings, placement)
    started = time.perf_counter()
    try:
        for rows, length in shapes:
            session.run(outputs, zeros_feed(inputs, rows, length, settings.pad_inputs))
    except Exception as exc:  # a model may reject zeros (e.g. indices); it still serves
        logger.info("%s: warm-up run skipped: %s", where, exc)
        return
    if len(shapes) > 1:
        logger.info("%s: warmed %d shapes in %.1f s", where, len(shapes), time.perf_counter() - started)


def tensor_specs(
    args: Sequence[ort.NodeArg],
    overrides: Mapping[str, TensorOverride],
    where: str,
    kind: str,
) -> tuple[TensorSpec, ...]:
    """A graph's inputs or outputs (``kind``) as V2 specs, with the manifest's shape ``overrides``."""
    names = {a.name for a in args}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ModelLoadError(f"{where}: manifest overrides unknown {kind}s {unknown}; graph has {sorted(names)}")
    specs = []
    for arg in args:
        datatype = ORT_TO_V2.get(arg.type)
        if datatype is None:
            raise ModelLoadError(f"{where}: {kind} {arg.name!r} has unsupported type {arg.type}")
        shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
        override = overrides.get(arg.name)
        if override is not None and override.shape is not None:
            shape = _merge_shape(shape, tuple(override.shape), where, f"{kind} {arg.name!r}")
        specs.append(TensorSpec(arg.name, datatype, V2_TO_NUMPY[datatype], shape))
    return tuple(specs)


def _merge_shape(graph: tuple[int, ...], override: tuple[int, ...], where: str, what: str) -> tuple[int, ...]:
    if len(graph) != len(override):
        raise ModelLoadError(
            f"{where}: {what} override {list(override)} has rank {len(override)}, graph has {len(graph)}"
        )
    for axis, (g, o) in enumerate(zip(graph, override, strict=True)):
        if g != -1 and o != g:
            raise ModelLoadError(f"{where}: {what} override sets axis {axis} to {o}, graph fixes it at {g}")
    return override
