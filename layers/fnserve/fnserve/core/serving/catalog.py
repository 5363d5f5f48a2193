"""What a data plane serves, as the metadata, readiness and statistics routes see it: every served name (models,
pipelines, cascades), V2 model metadata, Triton's model configuration and statistics, readiness."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fnserve.core.errors import unknown_model
from fnserve.core.execution.servable import PipelineServable
from fnserve.core.execution.service import InferenceService
from fnserve.core.models.manifest.cascades import CascadeSettings
from fnserve.core.models.statistics import Statistics
from fnserve.core.serving.model_config import triton_config

if TYPE_CHECKING:
    from fnserve.core.jobs.cascade import CascadeRunner


class Catalog:
    """The names a data plane serves and what is told of them. ``statistics`` is where the data plane records each
    request, ``counted`` the version it is counted under when it names none; ``instances``: how many sessions of a
    model run at once (a server says, for Triton's configuration)."""

    def __init__(self, service: InferenceService, cascades: CascadeRunner | None = None) -> None:
        self.service = service
        self.cascades = cascades
        self._ready_when: list[Callable[[], bool]] = []
        self.instances = 1
        self.names = frozenset(self.served_names())
        registry = service.registry
        # The version a request's figures go under when it names none: a model's default; a pipeline's or a
        # cascade's, that of the model it runs (its fast one's): Triton's tools read every version as a number.
        self.counted: dict[str, str] = {name: registry.resolve(name).version for name in registry.names()}
        for p in registry.manifest.pipelines:
            self.counted[p.name] = p.version or self.counted[p.model]
        for c in cascades.cascades.values() if cascades is not None else ():
            self.counted[c.name] = c.fast_version or self.counted[c.fast]
        models_here = frozenset(registry.names())
        self.statistics = Statistics(
            [
                *((name, version, registry.executions[(name, version)]) for name, version in registry.executions),
                *((name, self.counted[name], None) for name in self.served_names() if name not in models_here),
            ]
        )

    def metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata of a served name; a cascade shows its fast model's tensors."""
        cascade = self._cascade(name, version)
        if cascade is None:
            return self.service.model_metadata(name, version)
        meta = self.service.model_metadata(cascade.fast, cascade.fast_version)
        return {**meta, "name": name, "versions": [], "platform": "fnserve_cascade"}

    def config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model configuration of a served name (:mod:`fnserve.core.serving.model_config`)."""
        cascade = self._cascade(name, version)
        if cascade is not None:
            servable = self.service.servable(cascade.fast, cascade.fast_version)
            return triton_config(name, servable, "fnserve_cascade", self.instances, [])
        servable = self.service.servable(name, version)
        if isinstance(servable, PipelineServable):
            return triton_config(name, servable, "fnserve_pipeline", self.instances, [])
        versions = [version] if version is not None else self.service.registry.versions(name)
        return triton_config(name, servable, "onnxruntime_onnx", self.instances, versions)

    def model_statistics(self, name: str | None = None, version: str | None = None) -> list[dict[str, Any]]:
        """Triton's statistics (``model_stats``): of every served name, one name's versions, or one version's."""
        if name is not None:
            if not self.statistics.knows(name):
                raise unknown_model(name)
            if version is not None and version not in self.statistics.versions(name):
                raise unknown_model(name, version)
        return self.statistics.report(name, version)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Whether a served name can answer (a cascade: both of its models)."""
        cascade = self._cascade(name, version)
        if cascade is None:
            return self.service.model_ready(name, version)
        return self.service.model_ready(cascade.fast, cascade.fast_version) and self.service.model_ready(
            cascade.slow, cascade.slow_version
        )

    def served_names(self) -> list[str]:
        """Every name a request may call: models, pipelines, cascades."""
        cascades = list(self.cascades.cascades) if self.cascades is not None else []
        return [*self.service.registry.names(), *self.service.pipelines, *cascades]

    def ready(self) -> bool:
        """Whether every model can serve, and every condition given to :meth:`ready_when` holds."""
        return self.service.ready() and all(condition() for condition in self._ready_when)

    def ready_when(self, condition: Callable[[], bool]) -> None:
        """Make :meth:`ready` also wait for ``condition`` (a server's: all its front processes listening)."""
        self._ready_when.append(condition)

    def _cascade(self, name: str, version: str | None) -> CascadeSettings | None:
        if self.cascades is None or version is not None:
            return None
        return self.cascades.cascades.get(name)
