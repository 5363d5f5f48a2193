"""Models whose sessions live in worker processes: the registry of a server's front process.

With ``parallel_workers >= 1``, ``fnserve serve`` is one front process (HTTP, validation,
the result cache, batching, cascades) and a :class:`~fnserve.core.pool.WorkerPool` of
inference workers, each holding every model's ONNX Runtime session. The front process
loads no model: its :class:`PooledRegistry` knows each model's tensors from the workers'
description, and its sessions send ``run`` to whichever worker is free. Everything above
the session (:class:`~fnserve.core.service.InferenceService`, the batcher) is the same code
in both modes. :func:`handle` is what a worker answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.core.datatypes import V2_TO_NUMPY
from fnserve.core.errors import BadRequest, ModelNotReady
from fnserve.core.pool import WorkerPool
from fnserve.core.registry import LoadedModel, ModelRegistry, TensorSpec
from fnserve.core.service import InferenceService
from fnserve.core.settings import Manifest, ModelSettings

Arrays = dict[str, np.ndarray[Any, Any]]


class PoolSession:
    """A session whose ``run`` happens in a pool worker (blocks the calling thread until it is done)."""

    def __init__(self, pool: WorkerPool, model: str, version: str, providers: Sequence[str]) -> None:
        self._pool = pool
        self._model = model
        self._version = version
        self._providers = list(providers)

    def run(self, names: Sequence[str], feed: Mapping[str, np.ndarray[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        request = {"op": "run", "model": self._model, "version": self._version, "outputs": list(names), "inputs": feed}
        outputs: Arrays = self._pool.invoke(request).result()
        return [outputs[name] for name in names]

    def get_providers(self) -> list[str]:
        return list(self._providers)


class PooledRegistry(ModelRegistry):
    """The manifest's models, served by ``pool``: specs from the workers, sessions that forward to them."""

    def __init__(self, manifest: Manifest, pool: WorkerPool) -> None:
        super().__init__(manifest)
        self.pool = pool
        described: dict[str, Any] = pool.invoke({"op": "describe"}).result()
        self._described = {(m["name"], m["version"]): m for m in described["models"]}

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


def handle(service: InferenceService, event: Mapping[str, Any]) -> Any:
    """A worker's answer to the front process: ``describe`` its models, or ``run`` one."""
    op = event.get("op")
    if op == "run":
        return service.run(event["model"], event["inputs"], version=event["version"], outputs=event["outputs"])
    if op == "describe":
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
        return {"models": models}
    raise BadRequest(f"unknown worker operation {op!r}")


def _spec(metadata: Mapping[str, Any]) -> TensorSpec:
    datatype = metadata["datatype"]
    return TensorSpec(metadata["name"], datatype, V2_TO_NUMPY[datatype], tuple(metadata["shape"]))
