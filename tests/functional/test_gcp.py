"""The Google Cloud HTTP function on the real functions-framework server (its ASGI mode), driven by tritonclient."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from fnserve.core.service import InferenceService
from tests.functional.conftest import start_http
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO
from tests.moto import free_port

DIGITS = np.load(DEMO_HOLDOUT)["input"]
LOGS: dict[str, Path] = {}  # the function's output, by its URL


@pytest.fixture(scope="module")
def function(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``functions-framework --asgi`` serving functions/gcp_api/main.py on the demo manifest (its pipelines too)."""
    port = free_port()
    log = tmp_path_factory.mktemp("gcp") / "function.log"
    source = REPO / "functions" / "gcp_api" / "main.py"
    command = [str(Path(sys.executable).parent / "functions-framework"), "--target", "infer", "--source", str(source)]
    command += ["--signature-type", "http", "--asgi", "--port", str(port)]
    proc, url = start_http(command, port, log, env={**os.environ, "FNSERVE_MANIFEST": str(DEMO_MANIFEST)})
    LOGS[url] = log
    yield url
    proc.terminate()
    proc.wait(timeout=15)


@pytest.fixture(scope="module")
def service() -> InferenceService:
    return InferenceService.from_manifest(DEMO_MANIFEST)


def test_tritonclient_infers_through_the_function_in_json_and_binary(function: str, service: InferenceService) -> None:
    client = triton.InferenceServerClient(function.removeprefix("http://"))
    assert client.is_server_ready() and client.is_model_ready("digits-accurate")
    assert client.get_model_metadata("digits-accurate")["inputs"][0]["shape"] == [-1, 64]
    expected = service.predict("digits-accurate", {"input": DIGITS[:5]})
    for binary in (False, True):
        tensor = triton.InferInput("input", [5, 64], "FP32")
        tensor.set_data_from_numpy(DIGITS[:5], binary_data=binary)
        outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("label", "probabilities")]
        result = client.infer("digits-accurate", [tensor], outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-6)
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"A warm container answers at once."], dtype=object))
    assert client.infer("minilm-embed", [text]).as_numpy("embedding").shape == (1, 384)
    client.close()


def test_bad_input_is_a_422_with_what_is_wrong(function: str) -> None:
    client = triton.InferenceServerClient(function.removeprefix("http://"))
    tensor = triton.InferInput("input", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="must have 64 at axis 1") as raised:
        client.infer("digits-accurate", [tensor])
    assert raised.value.status() == "422"
    client.close()
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
    response = httpx.post(f"{function}/v2/models/nope/infer", json=body)
    assert response.status_code == 404 and response.json() == {"error": "model 'nope' not found"}
    assert httpx.post(f"{function}/v2/models/digits-accurate/infer", content=b"{oops").status_code == 400


def test_models_load_once_per_instance(function: str) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
    for _ in range(3):
        assert httpx.post(f"{function}/v2/models/digits-fast/infer", json=body).status_code == 200
    log = LOGS[function].read_text()
    assert log.count("loaded model 'digits-fast'") == 1  # warm globals: once, not per request
