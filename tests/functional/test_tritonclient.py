"""The official Triton HTTP client works against fnserve unchanged, JSON and binary, both ways."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, sample_arrays

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
