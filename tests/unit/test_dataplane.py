"""The data plane without any transport: one answer type for models, cached models and results."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fnserve.core.cache import ResultCache
from fnserve.core.dataplane import DataPlane
from fnserve.core.errors import ConfigError, ModelNotFound, ResultNotFound
from fnserve.core.followups import FollowupIds, ResultLookup
from fnserve.core.jobs import MAX_MESSAGE_BYTES
from fnserve.core.service import InferenceService
from fnserve.stores.objects import job_body
from tests.helpers import ManifestWriter, MemoryStore, model_bytes


def feed() -> dict[str, np.ndarray]:
    return {"x": np.ones((2, 3), np.float32), "k": np.arange(2, dtype=np.int64)}


@pytest.fixture
def plane(write_manifest: ManifestWriter) -> DataPlane:
    manifest = write_manifest({"data": model_bytes(), "cache_ttl_seconds": 60})
    service = InferenceService.from_manifest(manifest, cache=ResultCache())
    return DataPlane(service, results=ResultLookup(MemoryStore(), FollowupIds(b"k")))


def test_a_model_answers_with_its_version_cache_state_and_timings(plane: DataPlane) -> None:
    first = asyncio.run(plane.infer("scale", feed(), outputs=["k1"]))
    again = asyncio.run(plane.infer("scale", feed(), outputs=["k1"]))
    assert (first.name, first.model, first.version, list(first.outputs)) == ("scale", "scale", "1", ["k1"])
    np.testing.assert_array_equal(first.outputs["k1"], [1, 2])
    assert (first.cache, first.parameters) == ("miss", {"cache": "miss"})
    assert (again.cache, again.parameters) == ("hit", {"cache": "hit"})
    assert set(first.timings) == {"infer"} and first.timings["infer"] >= 0


def test_unknown_names_and_versions_are_404(plane: DataPlane) -> None:
    with pytest.raises(ModelNotFound):
        asyncio.run(plane.infer("nope", feed()))
    with pytest.raises(ModelNotFound, match="'scale' version 2 is not found"):
        asyncio.run(plane.infer("scale", feed(), version="2"))


def test_unknown_results_and_a_plane_without_results_are_not_found(plane: DataPlane) -> None:
    with pytest.raises(ResultNotFound, match="'job-9' not found"):
        asyncio.run(plane.result("job-9"))
    with pytest.raises(ResultNotFound, match="no results table"):
        asyncio.run(DataPlane(plane.service).result("job-9"))


def test_a_job_over_the_message_limit_without_a_bucket_is_a_configuration_error() -> None:
    job = {"id": "big", "model": "m", "inputs": [{"name": "x", "data": [0.0] * 400_000}]}
    with pytest.raises(ConfigError, match="no bucket is set"):
        job_body(job, bucket=None, limit=MAX_MESSAGE_BYTES)


def test_ready_waits_for_every_condition_the_server_adds(plane: DataPlane) -> None:
    assert plane.ready()
    others_listening = [False]
    plane.ready_when(lambda: others_listening[0])
    assert not plane.ready()
    others_listening[0] = True
    assert plane.ready()
