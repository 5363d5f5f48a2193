"""The official Triton HTTP client works against fnserve unchanged, JSON and binary, both ways, compressed or not."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, sample_arrays
from tests.helpers.serving import MAX_REQUEST_BYTES

HOLDOUT = np.load(DEMO_HOLDOUT)


def raw_onnxruntime(model: str, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
    return session.run(["label", "probabilities"], {"input": x})  # type: ignore[no-any-return]


@pytest.fixture
def client(server: str) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.removeprefix("http://"))
    yield c
    c.close()


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready("digits-accurate")
    meta = client.get_model_metadata("digits-accurate", "1")
    assert [o["name"] for o in meta["outputs"]] == ["label", "probabilities"]


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
def test_digits_inference(client: triton.InferenceServerClient, binary_in: bool, binary_out: bool) -> None:
    x = HOLDOUT["input"][:16]
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary_out) for name in ("label", "probabilities")]
    result = client.infer("digits-accurate", [inp], outputs=outputs, request_id="t-1")
    label, probabilities = raw_onnxruntime("digits-accurate", x)
    np.testing.assert_array_equal(result.as_numpy("label"), label)
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-6)
    assert np.mean(label == HOLDOUT["labels"][:16]) > 0.9
    assert result.get_response()["id"] == "t-1"


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype_round_trips(client: triton.InferenceServerClient, binary: bool) -> None:
    arrays = sample_arrays()
    inputs, outputs = [], []
    for datatype, array in arrays.items():
        if datatype == "FP16" and not binary:
            continue  # tritonclient sends FP16 as binary only
        inp = triton.InferInput(f"in_{datatype}", list(array.shape), datatype)
        inp.set_data_from_numpy(array, binary_data=binary)
        inputs.append(inp)
        outputs.append(triton.InferRequestedOutput(f"out_{datatype}", binary_data=binary))
    if not binary:  # the model needs every input: send FP16 as binary beside the JSON ones
        inp = triton.InferInput("in_FP16", [3, 2], "FP16")
        inp.set_data_from_numpy(arrays["FP16"], binary_data=True)
        inputs.append(inp)
    result = client.infer("identity", inputs, outputs=outputs)
    for datatype, array in arrays.items():
        if datatype == "FP16" and not binary:
            continue
        got = result.as_numpy(f"out_{datatype}")
        assert got is not None, datatype
        if datatype == "BYTES":
            got = np.array([v if isinstance(v, bytes) else str(v).encode() for v in got.ravel()], dtype=object)
            assert got.tolist() == array.ravel().tolist()
        else:
            np.testing.assert_array_equal(got, array)


def test_errors_reach_the_client_with_their_message(client: triton.InferenceServerClient) -> None:
    inp = triton.InferInput("input", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="must have 64 at axis 1"):
        client.infer("digits-fast", [inp])
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        client.infer("nope", [inp])


# -- compression, as tritonclient asks for it --------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True])
def test_compressed_requests_and_answers(client: triton.InferenceServerClient, algorithm: str, binary: bool) -> None:
    x = HOLDOUT["input"][:64]
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("label", "probabilities")]
    result = client.infer(
        "digits-accurate",
        [inp],
        outputs=outputs,
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    label, probabilities = raw_onnxruntime("digits-accurate", x)
    np.testing.assert_array_equal(result.as_numpy("label"), label)
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-6)


def test_what_compression_does_on_the_wire(server: str) -> None:
    body = orjson.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [8, 64], "data": HOLDOUT["input"][:8].ravel().tolist()}
            ]
        }
    )
    url = f"{server}/v2/models/digits-accurate/infer"
    plain = httpx.post(url, content=body, headers={"content-type": "application/json"})
    asked = httpx.post(
        url, content=gzip.compress(body), headers={"content-encoding": "gzip", "accept-encoding": "br;q=1, gzip;q=0.5"}
    )
    assert asked.status_code == 200 and asked.headers["content-encoding"] == "gzip"
    assert asked.headers["vary"] == "accept-encoding"
    assert int(asked.headers["content-length"]) < len(plain.content)  # compressed on the wire
    assert asked.json()["outputs"] == plain.json()["outputs"]  # httpx inflates it
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = raw_deflate.compress(body) + raw_deflate.flush()
    assert httpx.post(url, content=raw, headers={"content-encoding": "deflate"}).status_code == 200  # no zlib wrapper
    unknown = httpx.post(url, content=body, headers={"content-encoding": "br"})
    assert unknown.status_code == 415 and "Content-Encoding 'br' is not supported" in unknown.json()["error"]
    corrupt = httpx.post(url, content=gzip.compress(body)[:-9], headers={"content-encoding": "gzip"})
    assert corrupt.status_code == 400 and "not valid gzip" in corrupt.json()["error"]
    bomb = gzip.compress(b" " * (MAX_REQUEST_BYTES + 1))  # small on the wire, over the limit unpacked
    assert len(bomb) < MAX_REQUEST_BYTES
    too_big = httpx.post(url, content=bomb, headers={"content-encoding": "gzip"})
    assert too_big.status_code == 413 and "decompresses to over" in too_big.json()["error"]
    assert httpx.get(f"{server}/v2/health/ready").status_code == 200
