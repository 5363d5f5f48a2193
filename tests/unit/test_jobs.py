"""Parsing a batch's jobs: stacked by structure, chunk by chunk, each refusal the job's own."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from fnserve.core.errors import FnserveError
from fnserve.core.jobs import messages as jobs
from fnserve.core.jobs.messages import CHUNK, job_message, parse_job, parse_jobs

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
        {"outputs": 5},
        {"parameters": "x"},
        {"parameters": {"timeout": -1}},
        {"parameters": {"binary_data_output": "yes"}},
    ],
    ids=[
        "empty-model",
        "number-model",
        "number-version",
        "number-output-name",
        "outputs-a-dict",
        "outputs-a-number",
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


def outcomes(bodies: list[Any]) -> list[Any]:
    """What parse_jobs gives each body: its job (stacked or parsed alone), or its error's message."""
    groups, singles = parse_jobs(bodies)
    found: dict[int, Any] = {i: s.message if isinstance(s, FnserveError) else s for i, s in singles.items()}
    for group in groups:
        found.update(zip(group.indexes, group.split(), strict=True))
    return [found[i] for i in range(len(bodies))]


def tensor_job(job_id: str, datatype: str, data: Any, shape: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    shape = shape if shape is not None else [1, len(data)]
    return {
        "id": job_id,
        "model": "m",
        "inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}],
    } | extra


INPUTS = '"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]'  # for jobs written as text
# Jobs of JSON numbers the fast path reads with simdjson, each beside good jobs of its kind: every one must come out
# as parse_job makes it (the same array, of the same type; or the same error).
ODD_JOBS = {
    "precise-fp64": tensor_job("a", "FP64", [0.1, 1 / 3, 2.0**-1074, 1.7976931348623157e308, -0.0, 12345678901234567]),
    "fp32-rounding": tensor_job("a", "FP32", [0.1, 16777217, 3.4028235e38, 1.401298464324817e-45]),
    "fp32-too-big": tensor_job("a", "FP32", [1.0, 3.5e38]),
    "fp16-too-big": tensor_job("a", "FP16", [1.0, 65520.0]),
    "past-fp64": '{"id": "a", "model": "m", '
    + INPUTS.replace('"FP32", "data": [1, 2]', '"FP64", "data": [1, 1e400]')
    + "}",
    "a-string": tensor_job("a", "FP32", [1.0, "2.0"]),
    "a-null": tensor_job("a", "FP32", [1.0, None]),
    "a-bool": tensor_job("a", "FP32", [True, 2.0]),
    "int8": tensor_job("a", "INT8", [-128, 127]),
    "int8-too-big": tensor_job("a", "INT8", [1, 128]),
    "int32-a-float": tensor_job("a", "INT32", [1, 2.0]),
    "int64-big": tensor_job("a", "INT64", [2**63 - 1, -(2**63)]),
    "int64-past": tensor_job("a", "INT64", [1, 2**63]),
    "uint8-negative": tensor_job("a", "UINT8", [1, -1]),
    "uint64-big": tensor_job("a", "UINT64", [2**64 - 1, 2**63 + 1]),
    "bool": tensor_job("a", "BOOL", [True, False]),
    "bytes": tensor_job("a", "BYTES", ["x", "y"]),
    "nested": tensor_job("a", "FP32", [[1.0, 2.0]]),
    "nested-singletons": tensor_job("a", "FP32", [[1.0], [2.0]], shape=[2]),
    "ragged-same-count": tensor_job("a", "FP32", [[1.0], 2.0], shape=[2]),
    "ragged-empty": tensor_job("a", "FP32", [[], 1.0, [2.0, 3.0]], shape=[3]),
    "too-few": tensor_job("a", "FP32", [1.0], shape=[1, 2]),
    "float-shape": tensor_job("a", "FP32", [1.0, 2.0], shape=[1.0, 2]),
    "nested-shape": tensor_job("a", "FP32", [1.0, 2.0], shape=[[1], 2]),
    "object-shape": tensor_job("a", "FP32", [1.0, 2.0], shape={"rows": 1}),
    "a-tensor-parameter": '{"id": "a", "model": "m", ' + INPUTS.replace('"FP32",', '"FP32", "parameters": {},') + "}",
    "no-data": '{"id": "a", "model": "m", ' + INPUTS.replace('"data": [1, 2]', '"extra": [1, 2]') + "}",
    "id-twice": '{"id": "first", "model": "m", ' + INPUTS + ', "id": "second"}',  # orjson keeps the last
    "data-twice": '{"id": "a", "model": "m", ' + INPUTS.replace("[1, 2]}", '[1, 2], "data": [3, 4]}') + "}",
    "version-null": tensor_job("a", "FP32", [1.0, 2.0], version=None),
    "binary-null": tensor_job("a", "FP32", [1.0, 2.0], binary_data=None),
    "outputs": tensor_job("a", "FP32", [1.0, 2.0], outputs=[{"name": "y"}]),
    "outputs-null": tensor_job("a", "FP32", [1.0, 2.0], outputs=None),
    "outputs-holding-a-list": tensor_job("a", "FP32", [1.0, 2.0], outputs=[{"name": "y", "z": [1]}]),
    "unknown-key": tensor_job("a", "FP32", [1.0, 2.0], priority=3),
    "not-an-object": "[1, 2]",
    "a-bracket-in-a-model": '{"id": "a", "model": "m[1]", ' + INPUTS + "}",
}


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
@pytest.mark.parametrize("odd", ODD_JOBS.values(), ids=ODD_JOBS.keys())
def test_every_json_numbers_job_comes_out_as_parse_job_makes_it(odd: Any, as_bytes: bool) -> None:
    odd_text = odd if isinstance(odd, str) else json.dumps(odd)
    good = json.loads(odd_text) if odd_text.startswith("{") else tensor_job("a", "FP32", [1.0, 2.0])
    kin = [json.dumps(good | {"id": f"kin-{i}"}) for i in range(3)]  # jobs like it but the id, some maybe bad too
    bodies: list[Any] = [kin[0], odd_text, kin[1], body("other-model"), odd_text, kin[2]]
    if as_bytes:
        bodies = [text.encode() for text in bodies]
    got = outcomes(bodies)
    for text, outcome in zip(bodies, got, strict=True):
        try:
            expected: Any = parse_job(text)
        except FnserveError as exc:
            expected = exc.message
        if isinstance(expected, str):
            assert outcome == expected
            continue
        assert (outcome.id, outcome.model, outcome.version, outcome.outputs) == (
            expected.id,
            expected.model,
            expected.version,
            expected.outputs,
        )
        assert outcome.inputs.keys() == expected.inputs.keys()
        for name, array in expected.inputs.items():
            assert outcome.inputs[name].dtype == array.dtype
            assert outcome.inputs[name].shape == array.shape
            assert outcome.inputs[name].tobytes() == array.tobytes()  # -0.0 and the last bit of every float
