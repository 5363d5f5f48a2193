"""Models whose sessions live in pool workers: the registry of a server's front process.

With ``parallel_workers >= 1``, ``fnserve serve`` is one front process (HTTP, validation,
the result cache, batching, cascades) and a :class:`~fnserve.workers.pool.WorkerPool` of
inference workers, each holding every model's ONNX Runtime session. The front process
loads no model: its :class:`PooledRegistry` knows each model's tensors from the workers'
description, and its sessions send :class:`RunModel` to whichever worker is free.
Everything above the session (:class:`~fnserve.core.service.InferenceService`, the
batcher, the data plane) is the same code in both modes. :func:`handle` is what a worker answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.core.datatypes import V2_TO_NUMPY, Arrays
from fnserve.core.errors import BadRequest, ModelNotReady
from fnserve.core.manifest import Manifest, ModelSettings
from fnserve.core.registry import LoadedModel, ModelRegistry, TensorSpec
from fnserve.core.service import InferenceService
from fnserve.workers.messages import Describe, Described, RunModel
from fnserve.workers.pool import WorkerPool


class PoolSession:
    """A session whose ``run`` happens in a pool worker (blocks the calling thread until it is done)."""

    def __init__(self, pool: WorkerPool, model: str, version: str, providers: Sequence[str]) -> None:
        self._pool = pool
        self._model = model
        self._version = version
        self._providers = list(providers)

    def run(self, names: Sequence[str], feed: Mapping[str, np.ndarray[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        request = RunModel(self._model, self._version, list(names), dict(feed))
        outputs: Arrays = self._pool.invoke(request).result()
        return [outputs[name] for name in names]

    def get_providers(self) -> list[str]:
        return list(self._providers)


class PooledRegistry(ModelRegistry):
    """The manifest's models, served by ``pool``: specs from the workers, sessions that forward to them."""

    in_process = False

    def __init__(self, manifest: Manifest, pool: WorkerPool) -> None:
        super().__init__(manifest)
        self.pool = pool
        described: Described = pool.invoke(Describe()).result()
        self._described = {(m["name"], m["version"]): m for m in described.models}

    def _load(self, settings: ModelSettings) -> LoadedModel:
        described = self._described.get((settings.name, settings.version))
        if described is None:  # the workers load every model before they are ready
            raise ModelNotReady(f"model {settings.name!r} version {settings.version!r} is not loaded in the workers")
        inputs = tuple(_spec(s) for s in described["inputs"])
        outputs = tuple(_spec(s) for s in described["outputs"])
        return LoadedModel(
            settings=settings,
            session=PoolSession(self.pool, settings.name, settings.version, described["providers"]),
            inputs=inputs,
            outputs=outputs,
            output_names=tuple(o.name for o in outputs),
            output_set=frozenset(o.name for o in outputs),
            path=Path(settings.path),
        )


def handle(service: InferenceService, event: RunModel | Describe) -> Arrays | Described:
    """A worker's answer to the front process: run one model, or describe them all."""
    if isinstance(event, RunModel):
        return service.run(event.model, event.inputs, version=event.version, outputs=event.outputs)
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
                        "providers": loaded.session.get_providers(),
                        "inputs": [spec.to_metadata() for spec in loaded.inputs],
                        "outputs": [spec.to_metadata() for spec in loaded.outputs],
                    }
                )
        return Described(models)
    raise BadRequest(f"unknown worker request {type(event).__name__}")


def _spec(metadata: Mapping[str, Any]) -> TensorSpec:
    datatype = metadata["datatype"]
    return TensorSpec(metadata["name"], datatype, V2_TO_NUMPY[datatype], tuple(metadata["shape"]))
