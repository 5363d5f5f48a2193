"""The data plane without any transport: one answer type for models, cached models and results."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import numpy as np
import pytest

from fnserve.core.errors import ConfigError, FnserveError, ModelNotFound, Overloaded, ResultNotFound
from fnserve.core.execution.cache import ResultCache
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.followups import FollowupIds, ResultLookup
from fnserve.core.jobs.messages import MAX_MESSAGE_BYTES
from fnserve.core.serving.dataplane import Answer, DataPlane
from fnserve.stores.objects import job_body
from tests.helpers import Arrived, ManifestWriter, MemoryBackend, MemoryStore, model_bytes


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
    assert plane.catalog.ready()
    others_listening = [False]
    plane.catalog.ready_when(lambda: others_listening[0])
    assert not plane.catalog.ready()
    others_listening[0] = True
    assert plane.catalog.ready()


class Ended:
    """A transport's recorder that keeps how each request ended: 200, or the refusal's status."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    def start(self, name: str, version: str | None, traceparent: str | None) -> Ended:
        return self

    def served(self, answer: Answer, timings: dict[str, float]) -> None:
        self.statuses.append(200)

    def refused(self, error: FnserveError) -> None:
        self.statuses.append(error.status_code)

    def cancelled(self, reason: str) -> None:
        raise AssertionError(f"no request was cancelled: {reason}")


def test_a_callers_deadline_refuses_a_batched_request_foreseen_past_it_before_its_body_is_read(
    write_manifest: ManifestWriter,
) -> None:
    """A caller's deadline (gRPC's, known before the body) reaches the batcher: behind a running batch and one
    queued, at 0.4 s a row, a request would be answered in about 1 s; with 0.5 s left it is refused at once (503),
    its body never read, and with 5 s it is let in and answered."""
    manifest = write_manifest({"data": model_bytes(), "max_batch_time_ms": 1, "max_batch_size": 2})
    service = InferenceService.from_manifest(manifest)
    release = threading.Event()
    run = service.run

    def held(model: str, feed: Any, **options: Any) -> Any:
        release.wait(30)  # the batch runs until the test lets it go
        return run(model, feed, **options)

    service.run = held  # type: ignore[method-assign]
    plane = DataPlane(service, batching=True)
    batcher = plane.batchers["scale"]
    batcher.admission.pace.add(2, 0.8)  # as its latest runs measured it
    one = {"x": np.ones((1, 3), np.float32), "k": np.arange(1, dtype=np.int64)}
    recorder = Ended()
    bodies_read: list[float] = []

    def served(deadline: float) -> Any:
        return plane.serve(
            recorder, Arrived("scale", one, deadline=deadline, on_read=lambda: bodies_read.append(deadline))
        )

    async def main() -> list[Any]:
        running = asyncio.create_task(plane.infer("scale", one))
        while batcher.running() < 1:
            await asyncio.sleep(0.001)
        queued = asyncio.create_task(plane.infer("scale", one))
        while batcher.queued() < 1:
            await asyncio.sleep(0.001)
        with pytest.raises(Overloaded, match="past its deadline of 500 ms"):
            await served(0.5)
        patient = asyncio.create_task(served(5.0))
        while batcher.queued() < 2:
            await asyncio.sleep(0.001)
        release.set()
        return await asyncio.gather(running, queued, patient)

    answers = asyncio.run(main())
    assert len(answers) == 3 and bodies_read == [5.0]  # the refused one's body was never read
    assert recorder.statuses == [503, 200] and batcher.admission.shed == 1


class OnDevice:
    """A session that says which device ran each call, as a pool's session does where its workers mix devices."""

    def __init__(self, session: Any, device: str) -> None:
        self.session, self.device = session, device

    def run_on(self, names: Any, feed: Any) -> tuple[list[np.ndarray], str]:
        return self.session.run(names, feed), self.device


@pytest.mark.parametrize("road", ["alone", "turns", "batched", "batched, remote cache"])
def test_an_answer_carries_the_device_that_ran_it_on_every_road(write_manifest: ManifestWriter, road: str) -> None:
    """No context variable carries it: the run's device travels back in its answer, whichever road it took."""
    batched = {"max_batch_time_ms": 1.0} if road.startswith("batched") else {}
    service = InferenceService.from_manifest(write_manifest({"data": model_bytes(), **batched}))
    servable = service.servable("scale")
    servable.model = dataclasses.replace(servable.model, session=OnDevice(servable.model.session, "cuda:7"))
    if road == "batched, remote cache":
        service.cache = ResultCache(backend=MemoryBackend())  # its store leaves the process: finished beside the batch
    plane = DataPlane(service, batching=road != "alone", offload=road == "batched, remote cache")

    async def main() -> list[Answer]:
        try:
            return await asyncio.gather(*(plane.infer("scale", feed()) for _ in range(3)))
        finally:
            await plane.close()

    answers = asyncio.run(main())
    assert [a.device for a in answers] == ["cuda:7"] * 3
    np.testing.assert_array_equal(answers[0].outputs["k1"], [1, 2])
