"""Requests that one turn of the event loop decodes, run as one call of their model (a server's data plane)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fnserve.adapters.lambda_.sqs import records_of
from fnserve.aws.events import sqs_event
from fnserve.core.errors import ConfigError, InvalidInput, ModelNotFound
from fnserve.core.execution.cache import ResultCache
from fnserve.core.execution.servable import Servable
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.messages import job_message
from fnserve.core.jobs.processor import JobProcessor
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.core.models.providers import Placement
from fnserve.core.models.statistics import Executions
from fnserve.core.serving.dataplane import Answer, DataPlane
from tests.helpers import ManifestWriter, MemoryStore, model_bytes


def request(i: int, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 3), i, np.float32), "k": np.full(rows, i, np.int64)}


def build(write_manifest: ManifestWriter, *, batching: bool = True, **entry: Any) -> DataPlane:
    manifest = write_manifest({"data": model_bytes(), **entry}, {"data": model_bytes(), "version": "2", **entry})
    return DataPlane(InferenceService.from_manifest(manifest, cache=ResultCache()), batching=batching)


def executions(plane: DataPlane, version: str = "2") -> Executions:
    return plane.service.registry.executions[("scale", version)]


def together(*calls: Callable[[], Awaitable[Answer]]) -> list[Answer | BaseException]:
    """The calls started in one turn of a new loop, as the requests a turn decodes are."""

    async def main() -> list[Answer | BaseException]:
        return await asyncio.gather(*(call() for call in calls), return_exceptions=True)

    return asyncio.run(main())


def test_the_requests_of_one_turn_run_as_one_call_and_each_gets_its_own_rows(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)
    answers = together(*(lambda i=i: plane.infer("scale", request(i, rows=i)) for i in range(1, 6)))
    for i, answer in enumerate(answers, start=1):
        assert isinstance(answer, Answer)
        np.testing.assert_array_equal(answer.outputs["y"], np.full((i, 3), 2 * i, np.float32))
        np.testing.assert_array_equal(answer.outputs["k1"], np.full(i, i + 1))
        assert (answer.model, answer.version, answer.cache) == ("scale", "2", "off")
    ran = executions(plane)
    assert (ran.runs, ran.rows) == (1, 15)
    assert plane.turns is not None and plane.turns.runs == 1


def test_requests_one_after_another_each_run_alone(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)

    async def one_by_one() -> list[Answer]:
        return [await plane.infer("scale", request(i)) for i in range(3)]

    answers = asyncio.run(one_by_one())
    assert [int(a.outputs["k1"][0]) for a in answers] == [1, 2, 3]
    assert executions(plane).runs == 3


def test_a_bad_request_fails_alone_and_the_rest_of_its_turn_is_answered(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)
    bad = {"x": np.ones((1, 4), np.float32), "k": np.ones(1, np.int64)}  # 4 columns, the model takes 3
    answers = together(
        lambda: plane.infer("scale", request(1)),
        lambda: plane.infer("scale", bad),
        lambda: plane.infer("scale", request(3)),
    )
    assert isinstance(answers[1], InvalidInput) and "x" in answers[1].message
    assert [int(a.outputs["k1"][0]) for a in answers if isinstance(a, Answer)] == [2, 4]
    assert (executions(plane).runs, executions(plane).rows) == (1, 2)


def test_versions_and_outputs_asked_for_are_runs_of_their_own(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)
    answers = together(
        lambda: plane.infer("scale", request(1)),
        lambda: plane.infer("scale", request(2)),
        lambda: plane.infer("scale", request(3), version="1"),
        lambda: plane.infer("scale", request(4), outputs=["k1"]),
    )
    assert [list(a.outputs) for a in answers if isinstance(a, Answer)] == [["y", "k1"]] * 3 + [["k1"]]
    assert [a.version for a in answers if isinstance(a, Answer)] == ["2", "2", "1", "2"]
    assert (executions(plane).runs, executions(plane).rows, executions(plane, "1").runs) == (2, 3, 1)


def test_a_request_whose_caller_left_before_its_turn_ran_is_not_computed(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)

    async def main() -> Answer:
        stays = asyncio.ensure_future(plane.infer("scale", request(1)))
        leaves = asyncio.ensure_future(plane.infer("scale", request(2, rows=4)))
        await asyncio.sleep(0)  # both tasks start and wait for their turn's run, which has not run yet
        leaves.cancel()
        return await stays

    assert int(asyncio.run(main()).outputs["k1"][0]) == 2
    assert (executions(plane).runs, executions(plane).rows) == (1, 1)


def test_a_turn_whose_first_request_left_still_answers_the_others(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)

    async def main() -> Answer:
        leads = asyncio.ensure_future(plane.infer("scale", request(1, rows=4)))
        joins = asyncio.ensure_future(plane.infer("scale", request(2)))
        await asyncio.sleep(0)  # the first leads the turn, the second joins it; the turn has not run yet
        leads.cancel()
        async with asyncio.timeout(10):  # a hang, if the turn were dropped with its leader
            return await joins

    assert int(asyncio.run(main()).outputs["k1"][0]) == 3
    assert (executions(plane).runs, executions(plane).rows) == (1, 1)


def test_an_unknown_version_fails_every_request_that_names_it(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)
    answers = together(*(lambda: plane.infer("scale", request(1), version="9") for _ in range(2)))
    assert all(isinstance(a, ModelNotFound) for a in answers)


def test_cached_requests_share_one_lookup_and_are_remembered(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest, cache_ttl_seconds=60)
    first = together(lambda: plane.infer("scale", request(1)), lambda: plane.infer("scale", request(2)))
    again = together(lambda: plane.infer("scale", request(1)), lambda: plane.infer("scale", request(5)))
    assert [a.cache for a in first if isinstance(a, Answer)] == ["miss", "miss"]
    assert [a.cache for a in again if isinstance(a, Answer)] == ["hit", "miss"]
    assert (executions(plane).runs, executions(plane).rows) == (2, 3)


def test_a_model_whose_requests_may_not_stack_runs_each_alone(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest, stack_requests=False)
    answers = together(*(lambda i=i: plane.infer("scale", request(i)) for i in range(3)))
    assert [int(a.outputs["k1"][0]) for a in answers if isinstance(a, Answer)] == [1, 2, 3]
    assert executions(plane).runs == 3
    # A queue's batch of jobs too, though its parser stacked them.
    bodies = [json.dumps(job_message(f"j-{i}", "scale", request(i))) for i in range(4)]
    outcome = JobProcessor(plane.service, MemoryStore(), ttl_seconds=60).process(records_of(sqs_event(bodies)))
    assert (outcome.done, outcome.failures) == (4, [])
    assert executions(plane).runs == 7


def test_a_queue_batch_of_a_model_that_stacks_runs_as_one_call(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest)
    bodies = [json.dumps(job_message(f"j-{i}", "scale", request(i))) for i in range(4)]
    outcome = JobProcessor(plane.service, MemoryStore(), ttl_seconds=60).process(records_of(sqs_event(bodies)))
    assert (outcome.done, executions(plane).runs, executions(plane).rows) == (4, 1, 4)


def test_a_model_on_a_gpu_runs_each_request_as_it_comes(write_manifest: ManifestWriter) -> None:
    """On a GPU a batch of a new size is a new plan (cuDNN's search): only the adaptive batcher joins requests."""
    plane = build(write_manifest)
    servable = plane.service.servable("scale", "2")
    on_gpu = replace(servable.model, placement=Placement(("CUDAExecutionProvider", "CPUExecutionProvider"), "cuda:0"))
    plane.service._models[("scale", "2")] = Servable(on_gpu)
    answers = together(*(lambda i=i: plane.infer("scale", request(i), version="2") for i in range(3)))
    assert [int(a.outputs["k1"][0]) for a in answers if isinstance(a, Answer)] == [1, 2, 3]
    assert executions(plane).runs == 3 and plane.turns is not None and plane.turns.runs == 0
    # Its queue jobs still stack: a batch job is a batch whatever runs it.
    bodies = [json.dumps(job_message(f"j-{i}", "scale", request(i), version="2")) for i in range(4)]
    outcome = JobProcessor(plane.service, MemoryStore(), ttl_seconds=60).process(records_of(sqs_event(bodies)))
    assert (outcome.done, executions(plane).runs, executions(plane).rows) == (4, 4, 7)


def test_a_process_that_answers_one_request_at_a_time_runs_each_as_it_comes(write_manifest: ManifestWriter) -> None:
    plane = build(write_manifest, batching=False)  # Lambda's
    assert plane.turns is None
    together(*(lambda i=i: plane.infer("scale", request(i)) for i in range(3)))
    assert executions(plane).runs == 3


def test_adaptive_batching_needs_stacked_requests(write_manifest: ManifestWriter) -> None:
    manifest = write_manifest({"data": model_bytes(), "stack_requests": False, "max_batch_time_ms": 2})
    with pytest.raises(ConfigError, match="needs stack_requests"):
        load_manifest(manifest)
