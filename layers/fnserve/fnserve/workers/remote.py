"""Models whose sessions live in pool workers: the registry of a server's front process.

With ``parallel_workers >= 1``, ``fnserve serve`` is one front process (HTTP, validation,
the result cache, batching, cascades) and a :class:`~fnserve.workers.pool.WorkerPool` of
inference workers, each holding every model's ONNX Runtime session. The front process
loads no model: its :class:`PooledRegistry` knows each model's tensors from the workers'
description, and its sessions send :class:`RunModel` to whichever worker is free.
Everything above the session (:class:`~fnserve.core.execution.service.InferenceService`, the
batcher, the data plane) is the same code in both modes. :func:`handle` is what a worker answers.

A mixed-device pool is two pools: the GPU's workers (the manifest's providers) and CPU
workers (``device = "cpu"``: CPU providers alone). :class:`Overflow` fills the GPU up to a
number of calls in flight, then sends calls to CPU workers while one is idle; when both are
full, calls queue for the GPU, the faster device.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.core.errors import BadRequest, ModelNotReady
from fnserve.core.execution.service import InferenceService
from fnserve.core.models.datatypes import V2_TO_NUMPY, Arrays
from fnserve.core.models.manifest.loading import Manifest
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.providers import Placement
from fnserve.core.models.registry import LoadedModel, ModelRegistry, TensorSpec
from fnserve.core.models.statistics import Executions
from fnserve.workers.messages import Describe, Described, RunModel
from fnserve.workers.pool import WorkerPool


@dataclass(frozen=True)
class Group:
    """Workers of one device: their pool, the label requests see (``gpu``, ``cpu``), and how many calls they
    take in flight before calls overflow to the next group (``None``: as many as they have workers)."""

    device: str
    pool: WorkerPool
    capacity: int | None = None

    @property
    def limit(self) -> int:
        return self.capacity if self.capacity is not None else self.pool.size


class Overflow:
    """Where each call goes: the first group (the GPU) until it has ``capacity`` calls in flight, then the
    next group with room (the CPU workers); when every group is full, the first. Counts calls per device."""

    def __init__(self, groups: list[Group]) -> None:
        if not groups:
            raise ValueError("a pool needs at least one group of workers")
        self.groups = groups
        self.in_flight = [0] * len(groups)
        self.runs = {group.device: 0 for group in groups}  # calls sent to each device, for metrics
        self._lock = threading.Lock()

    @property
    def mixed(self) -> bool:
        return len(self.groups) > 1

    def invoke(self, request: Any, priority: int = 0) -> tuple[Future[Any], str]:
        """Send ``request`` to a group's pool (ahead of queued calls of a lower ``priority``): its future, and the
        device that runs it."""
        with self._lock:
            index = next((i for i, g in enumerate(self.groups) if self.in_flight[i] < g.limit), 0)
            self.in_flight[index] += 1
            group = self.groups[index]
            self.runs[group.device] += 1
        future = group.pool.invoke(request, priority)
        future.add_done_callback(lambda _: self._done(index))
        return future, group.device

    def _done(self, index: int) -> None:
        with self._lock:
            self.in_flight[index] -= 1

    def worker_pids(self) -> list[int]:
        return [pid for group in self.groups for pid in group.pool.worker_pids()]

    @property
    def respawns(self) -> int:
        """Workers replaced after dying, over every group."""
        return sum(group.pool.respawns for group in self.groups)

    def close(self) -> None:
        for group in self.groups:
            group.pool.close()


class PoolSession:
    """A session whose ``run`` happens in a pool worker (blocks the calling thread until it is done)."""

    def __init__(self, workers: Overflow, model: str, version: str, providers: list[str], priority: int = 0) -> None:
        self._workers = workers
        self._model = model
        self._version = version
        self._providers = providers
        self._priority = priority  # the model's: its calls go before queued ones of lower priority models

    def run(self, names: Sequence[str], feed: Mapping[str, np.ndarray[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        return self.run_on(names, feed)[0]

    def run_on(
        self, names: Sequence[str], feed: Mapping[str, np.ndarray[Any, Any]]
    ) -> tuple[list[np.ndarray[Any, Any]], str | None]:
        """:meth:`run`'s outputs, and the device of the group that ran them where a pool mixes devices."""
        request = RunModel(self._model, self._version, list(names), dict(feed))
        future, device = self._workers.invoke(request, self._priority)
        outputs: Arrays = future.result()
        return [outputs[name] for name in names], device if self._workers.mixed else None

    def get_providers(self) -> list[str]:
        return list(self._providers)


class Pools:
    """The manifest's worker groups in a front process: one pool of workers each, holding the group's models."""

    def __init__(self, pools: Mapping[str, Overflow]) -> None:
        self.pools = dict(pools)

    @property
    def groups(self) -> list[Group]:
        return [group for pool in self.pools.values() for group in pool.groups]

    @property
    def runs(self) -> dict[str, int]:
        """Calls sent to each group (by its name)."""
        return {device: n for pool in self.pools.values() for device, n in pool.runs.items()}

    @property
    def respawns(self) -> int:
        return sum(pool.respawns for pool in self.pools.values())

    def worker_pids(self) -> list[int]:
        return [pid for pool in self.pools.values() for pid in pool.worker_pids()]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()


class PlacedRegistry(ModelRegistry):
    """A front process's models when the manifest places some in worker groups: those run in their group's
    workers (described by them; sessions that forward there), the others load in this process."""

    in_process = False  # calls to a group's workers block: the data plane makes them from threads

    def __init__(self, manifest: Manifest, pools: Pools, **options: Any) -> None:
        super().__init__(manifest, **options)
        self._pools = pools
        self._described: dict[tuple[str, str], dict[str, Any]] = {}
        for group in manifest.groups:
            described: Described = pools.pools[group.name].groups[0].pool.invoke(Describe()).result()
            self._described |= {(m["name"], m["version"]): m for m in described.models}

    def _load(self, settings: ModelSettings) -> LoadedModel:
        group = self.manifest.group_of(settings.name)
        if group is None:
            return super()._load(settings)
        described = self._described.get((settings.name, settings.version))
        if described is None:
            raise ModelNotReady(
                f"model {settings.name!r} version {settings.version!r} is not loaded in worker group {group.name!r}"
            )
        executions = self.executions[(settings.name, settings.version)]
        return _pooled(settings, described, self._pools.pools[group.name], executions, group.name, group.workers)


class PooledRegistry(ModelRegistry):
    """The manifest's models, served by ``workers`` (a pool, or a GPU pool with CPU workers to overflow to):
    specs from the first group's workers, sessions that forward to whichever group :class:`Overflow` picks."""

    in_process = False

    def __init__(self, manifest: Manifest, workers: WorkerPool | Overflow) -> None:
        super().__init__(manifest)
        self.workers = workers if isinstance(workers, Overflow) else Overflow([Group("worker", workers)])
        described: Described = self.workers.groups[0].pool.invoke(Describe()).result()
        self._described = {(m["name"], m["version"]): m for m in described.models}

    def _load(self, settings: ModelSettings) -> LoadedModel:
        described = self._described.get((settings.name, settings.version))
        if described is None:  # the workers load every model before they are ready
            raise ModelNotReady(f"model {settings.name!r} version {settings.version!r} is not loaded in the workers")
        return _pooled(settings, described, self.workers, self.executions[(settings.name, settings.version)])


def _pooled(
    settings: ModelSettings,
    described: Mapping[str, Any],
    workers: Overflow,
    executions: Executions,
    group: str | None = None,
    group_workers: int | None = None,
) -> LoadedModel:
    """A model that ``workers`` run, as their first group described it."""
    inputs = tuple(_spec(s) for s in described["inputs"])
    outputs = tuple(_spec(s) for s in described["outputs"])
    placement = described["placement"]
    return LoadedModel(
        settings=settings,
        session=PoolSession(workers, settings.name, settings.version, placement["providers"], settings.priority),
        inputs=inputs,
        outputs=outputs,
        output_names=tuple(o.name for o in outputs),
        output_set=frozenset(o.name for o in outputs),
        path=Path(settings.path),
        # Where the first group's workers run it; in a mixed pool each call also says which group ran it.
        placement=Placement(
            tuple(placement["providers"]), placement["device"], placement.get("cpu_fallback"), group, group_workers
        ),
        load_seconds=float(described.get("load_seconds", 0.0)),  # in the worker that described it
        executions=executions,  # counted in the front process, where runs are sent
    )


def handle(service: InferenceService, event: RunModel | Describe) -> Arrays | Described:
    """A worker's answer to the front process: run one model, or describe them all."""
    if isinstance(event, RunModel):
        return service.run(event.model, event.inputs, version=event.version, outputs=event.outputs).outputs
    if isinstance(event, Describe):
        registry = service.registry
        models = []
        for name in registry.names():
            for version in registry.versions(name):
                loaded = registry.get(name, version)
                models.append(
                    {
                        "name": name,
                        "version": version,
                        "placement": loaded.placement.to_metadata(),
                        "load_seconds": loaded.load_seconds,
                        "inputs": [spec.to_metadata() for spec in loaded.inputs],
                        "outputs": [spec.to_metadata() for spec in loaded.outputs],
                    }
                )
        return Described(models)
    raise BadRequest(f"unknown worker request {type(event).__name__}")


def _spec(metadata: Mapping[str, Any]) -> TensorSpec:
    datatype = metadata["datatype"]
    return TensorSpec(metadata["name"], datatype, V2_TO_NUMPY[datatype], tuple(metadata["shape"]))
