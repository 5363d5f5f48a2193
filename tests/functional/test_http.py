"""The V2 HTTP API over real HTTP against a running ``fnserve serve``."""

from __future__ import annotations

import struct
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

import fnserve
from tests.helpers import DEMO_HOLDOUT, sample_arrays
from tests.helpers.serving import MAX_REQUEST_BYTES

HOLDOUT = np.load(DEMO_HOLDOUT)
DIGITS, LABELS = HOLDOUT["input"], HOLDOUT["labels"]


def digits_request(rows: slice = slice(0, 8), **fields: Any) -> dict[str, Any]:
    x = DIGITS[rows]
    return {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        **fields,
    }


def test_health_and_server_metadata(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    for path in ("/v2", "/v2/"):
        meta = client.get(path).json()
        assert meta["name"] == "fnserve" and "binary_tensor_data" in meta["extensions"]
        assert meta["version"] == fnserve.__version__


def test_model_metadata_and_readiness(client: httpx.Client) -> None:
    meta = client.get("/v2/models/digits-accurate").json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert client.get("/v2/models/digits-accurate/versions/1").json() == meta
    assert client.get("/v2/models/digits-accurate/ready").json() == {
        "name": "digits-accurate",
        "ready": True,
        "providers": ["CPUExecutionProvider"],  # where it runs, as its metadata's parameters say
        "device": "cpu",
    }
    assert client.get("/v2/models/digits-accurate/versions/1/ready").status_code == 200


@pytest.mark.parametrize("path", ["/v2/models/digits-accurate/infer", "/v2/models/digits-accurate/versions/1/infer"])
def test_json_inference_predicts_held_out_digits(client: httpx.Client, path: str) -> None:
    response = client.post(path, json=digits_request(id="abc"))
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["model_name"] == "digits-accurate" and doc["model_version"] == "1" and doc["id"] == "abc"
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert outputs["label"]["data"] == LABELS[:8].tolist()
    assert outputs["probabilities"]["shape"] == [8, 10]


def test_requested_outputs_only(client: httpx.Client) -> None:
    doc = client.post("/v2/models/digits-fast/infer", json=digits_request(outputs=[{"name": "label"}])).json()
    assert [o["name"] for o in doc["outputs"]] == ["label"]


def test_stage_timings_and_request_id_headers(client: httpx.Client) -> None:
    response = client.post("/v2/models/digits-fast/infer", json=digits_request(), headers={"x-request-id": "req-42"})
    assert response.headers["x-request-id"] == "req-42"
    stages = dict(part.strip().split(";dur=") for part in response.headers["server-timing"].split(","))
    assert set(stages) == {"decode", "infer", "encode"}
    assert all(float(v) >= 0 for v in stages.values())
    assert client.get("/v2").headers["x-request-id"]


def _identity_json_request(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    inputs = []
    for datatype, array in arrays.items():
        data = [v.decode() for v in array.ravel()] if datatype == "BYTES" else array.ravel().tolist()
        inputs.append({"name": f"in_{datatype}", "shape": list(array.shape), "datatype": datatype, "data": data})
    return {"inputs": inputs}


def test_every_datatype_round_trips_as_json(client: httpx.Client) -> None:
    arrays = sample_arrays()
    response = client.post("/v2/models/identity/infer", json=_identity_json_request(arrays))
    assert response.status_code == 200, response.text
    for out in response.json()["outputs"]:
        datatype = out["name"].removeprefix("out_")
        array = arrays[datatype]
        assert out["datatype"] == datatype and out["shape"] == list(array.shape)
        if datatype == "BYTES":
            assert out["data"] == [v.decode() for v in array.ravel()]
        else:
            np.testing.assert_array_equal(np.array(out["data"], dtype=array.dtype), array.ravel())


def test_every_datatype_round_trips_as_binary_both_ways(client: httpx.Client) -> None:
    arrays = sample_arrays()
    inputs, blobs = [], []
    for datatype, array in arrays.items():
        if datatype == "BYTES":
            blob = b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
        else:
            blob = array.tobytes()
        inputs.append(
            {
                "name": f"in_{datatype}",
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    head = orjson.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}})
    response = client.post(
        "/v2/models/identity/infer",
        content=head + b"".join(blobs),
        headers={
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(head)),
        },
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    head_length = int(response.headers["inference-header-content-length"])
    doc = orjson.loads(response.content[:head_length])
    offset = head_length
    for out in doc["outputs"]:
        datatype = out["name"].removeprefix("out_")
        size = out["parameters"]["binary_data_size"]
        chunk = response.content[offset : offset + size]
        offset += size
        expected = arrays[datatype]
        if datatype == "BYTES":
            assert chunk == b"".join(struct.pack("<I", len(v)) + v for v in expected.ravel())
        else:
            np.testing.assert_array_equal(np.frombuffer(chunk, expected.dtype).reshape(out["shape"]), expected)
    assert offset == len(response.content)


ERRORS = [
    ("post", "/v2/models/digits-fast/infer", {"content": b"{oops"}, 400, "request body is not valid JSON"),
    (
        "post",
        "/v2/models/digits-fast/infer",
        {"content": b"{}", "headers": {"inference-header-content-length": "x"}},
        400,
        "Inference-Header-Content-Length must be an integer",
    ),
    (
        "post",
        "/v2/models/nope/infer",
        {"json": digits_request()},
        404,
        "Request for unknown model: 'nope' is not found",
    ),
    (
        "post",
        "/v2/models/nope/infer",
        {"json": {}},
        404,
        "Request for unknown model: 'nope' is not found",
    ),  # the absence wins over the body
    (
        "post",
        "/v2/models/digits-fast/versions/9/infer",
        {"json": digits_request()},
        404,
        "Request for unknown model: 'digits-fast' version 9 is not found; available: 1",
    ),
    ("get", "/v2/models/nope", {}, 404, "Request for unknown model: 'nope' is not found"),
    ("get", "/v2/models/nope/ready", {}, 404, "Request for unknown model: 'nope' is not found"),
    ("get", "/v2/nothing-here", {}, 404, "Not Found"),
    ("get", "/v2/models/digits-fast/infer", {}, 405, "Method Not Allowed"),
    (
        "post",
        "/v2/models/digits-fast/infer",
        {"json": {"inputs": [{"name": "input", "shape": [1, 63], "datatype": "FP32", "data": [0] * 63}]}},
        422,
        "must have 64 at axis 1",
    ),
    (
        "post",
        "/v2/models/digits-fast/infer",
        {"json": {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "INT64", "data": [0] * 64}]}},
        422,
        "must be FP32 (float32); int64 cannot be cast to it safely",
    ),
    (
        "post",
        "/v2/models/digits-fast/infer",
        {"json": digits_request(outputs=[{"name": "logits"}])},
        422,
        "has no outputs ['logits']",
    ),
    (
        "post",
        "/v2/models/digits-fast/infer",
        {"json": {"inputs": []}},
        422,
        "'inputs' must be a non-empty list",
    ),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "message"), ERRORS)
def test_errors_have_the_right_status_and_say_what_is_wrong(
    client: httpx.Client, method: str, path: str, kwargs: dict[str, Any], status: int, message: str
) -> None:
    response = client.request(method.upper(), path, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert message in response.json()["error"]


def test_oversized_bodies_get_413_before_parsing(client: httpx.Client) -> None:
    big = b"[" + b"0," * MAX_REQUEST_BYTES + b"0]"
    response = client.post("/v2/models/digits-fast/infer", content=big)
    assert response.status_code == 413
    assert f"over the {MAX_REQUEST_BYTES}-byte limit" in response.json()["error"]

    def chunks() -> Any:  # no Content-Length: the limit is enforced while reading
        for _ in range(40):
            yield b" " * 32768

    response = client.post("/v2/models/digits-fast/infer", content=chunks())
    assert response.status_code == 413
    assert response.json() == {"error": f"request body is over the {MAX_REQUEST_BYTES}-byte limit"}


def test_a_bad_request_never_harms_the_next_one(client: httpx.Client) -> None:
    assert client.post("/v2/models/digits-fast/infer", content=b"\xff\xfe").status_code == 400
    response = client.post("/v2/models/digits-fast/infer", json=digits_request(slice(0, 1)))
    assert response.json()["outputs"][0]["data"] == [int(LABELS[0])]
