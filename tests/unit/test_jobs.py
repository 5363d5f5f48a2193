"""Parsing a batch's jobs: stacked by structure, chunk by chunk, each refusal the job's own."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fnserve.core import jobs
from fnserve.core.errors import FnserveError
from fnserve.core.jobs import CHUNK, job_message, parse_job, parse_jobs

ROWS = np.arange(64 * 3, dtype=np.float32).reshape(3, 64) / 7


def body(job_id: Any, rows: int = 1, binary: bool = False, **changes: Any) -> str:
    message = job_message("job", "digits", {"input": np.resize(ROWS, (rows, 64))}, binary=binary)
    message["id"] = job_id
    message["inputs"][0].update(changes)
    return json.dumps(message)


def alone(text: str) -> Any:
    """What a job parsed on its own gives: its inputs, or its error's message."""
    try:
        return parse_job(text).inputs["input"]
    except FnserveError as exc:
        return exc.message


@pytest.mark.parametrize("binary", [False, True])
def test_jobs_of_many_chunks_are_one_group_in_order_and_each_refusal_is_its_own(binary: bool) -> None:
    bodies = [body(f"j-{i}", rows=1 + (i % 50 == 7), binary=binary) for i in range(2 * CHUNK + 9)]
    bad = {CHUNK - 1: body("bad-last-of-a-chunk", binary=binary, shape=[1, 63]), CHUNK + 3: "not json"}
    for i, text in bad.items():
        bodies[i] = text
    groups, singles = parse_jobs(bodies)
    assert sorted(singles) == sorted(bad)
    assert [len(g.rows) for g in groups] == [2 * CHUNK + 9 - 2 - 6, 6]  # one row each, and the six of two
    assert all(g.indexes == sorted(g.indexes) for g in groups)
    for group in groups:
        for index, job in zip(group.indexes, group.split(), strict=True):
            assert job.id == json.loads(bodies[index])["id"]
            np.testing.assert_array_equal(job.inputs["input"], alone(bodies[index]))
    assert singles[CHUNK - 1].message == alone(bodies[CHUNK - 1])  # type: ignore[union-attr]
    assert "not valid JSON" in singles[CHUNK + 3].message  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("binary", "changes"),
    [
        (False, {"shape": [1.0, 64]}),
        (False, {"shape": [True, 64]}),
        (True, {"shape": [1, 64.0]}),
        (True, {"parameters": {"binary_data_size": 256.0}}),
    ],
    ids=["float-dim", "bool-dim", "binary-float-dim", "float-binary-size"],
)
def test_a_job_whose_structure_equals_its_neighbours_only_as_numbers_is_parsed_alone(
    binary: bool, changes: dict[str, Any]
) -> None:
    """1.0 == 1 and True == 1 in Python: the check that a job is like the last one must not say so."""
    bodies = [body(f"j-{i}", binary=binary) for i in range(4)]
    bodies[2] = body("odd", binary=binary, **changes)
    groups, singles = parse_jobs(bodies)
    assert [g.indexes for g in groups] == [[0, 1, 3]]
    assert isinstance(singles[2], FnserveError)
    assert singles[2].message == alone(bodies[2])


@pytest.mark.parametrize(
    "changes",
    [
        {"model": ""},
        {"model": 5},
        {"version": 1},
        {"outputs": [{"name": 1}]},
        {"outputs": {"name": "label"}},
        {"parameters": "x"},
        {"parameters": {"timeout": -1}},
        {"parameters": {"binary_data_output": "yes"}},
    ],
    ids=[
        "empty-model",
        "number-model",
        "number-version",
        "number-output-name",
        "outputs-not-a-list",
        "parameters-not-an-object",
        "negative-timeout",
        "binary-output-not-a-boolean",
    ],
)
@pytest.mark.parametrize("binary", [False, True])
def test_a_job_that_parse_job_refuses_is_refused_in_a_batch_with_the_same_error(
    binary: bool, changes: dict[str, Any]
) -> None:
    bodies = [body(f"j-{i}", binary=binary) for i in range(3)]
    odd = json.loads(body("odd", binary=binary))
    odd.update(changes)
    bodies[1] = json.dumps(odd)
    groups, singles = parse_jobs(bodies)
    assert [g.indexes for g in groups] == [[0, 2]]
    assert isinstance(singles[1], FnserveError)
    assert singles[1].message == alone(bodies[1])


def test_every_stacked_jobs_id_is_checked() -> None:
    ids = ["ok-0", "has space", "ok-2", "trailing-newline\n", 7, "x" * 201, "ok-6", "a:b.c_d-9"]
    groups, singles = parse_jobs([body(job_id) for job_id in ids])
    assert [g.ids for g in groups] == [["ok-0", "ok-2", "ok-6", "a:b.c_d-9"]]
    assert sorted(singles) == [1, 3, 4, 5]
    for error in singles.values():
        assert isinstance(error, FnserveError) and "job needs an 'id' of 1-200 letters" in error.message


def test_a_job_id_with_a_trailing_newline_is_refused_alone_too() -> None:
    assert "needs an 'id'" in alone(body("job-1\n"))
    assert jobs.job_identity(body("job-1\n")) is None
