"""SageMaker's hosting contract on a real ``fnserve serve``: /ping, /invocations in every body format."""

from __future__ import annotations

import io
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from fnserve.observability.metrics import FLUSH_SECONDS
from fnserve.settings import sagemaker_settings
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.servers import start_server

DIGITS = np.load(DEMO_HOLDOUT)["input"][:5]
ACCURATE = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))
LABELS = ACCURATE.run(["label"], {"input": DIGITS})[0]


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def invoke(url: str, body: bytes, content_type: str, **headers: str) -> httpx.Response:
    headers = {"content-type": content_type, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.post(f"{url}/invocations", content=body, headers=headers, timeout=30)


def answered(url: str, model: str, status: str) -> float:
    """fnserve_requests_total of ``model`` at ``status``, over versions and transports."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("fnserve_requests_total{") and f'model="{model}"' in line and f'status="{status}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def settled(url: str, model: str) -> tuple[float, float]:
    """``model``'s 200 and 422 counts once every process has flushed what earlier tests sent: the same in two
    scrapes a flush interval apart (the server is shared, and another process may still hold records)."""
    last = answered(url, model, "200"), answered(url, model, "422")
    deadline = time.monotonic() + 10 * FLUSH_SECONDS
    while time.monotonic() < deadline:
        time.sleep(1.2 * FLUSH_SECONDS)
        now = answered(url, model, "200"), answered(url, model, "422")
        if now == last:
            return now
        last = now
    raise AssertionError(f"{model}'s request counts kept changing: {last}")


def test_ping_answers_once_every_model_is_loaded(server: str) -> None:
    response = httpx.get(f"{server}/ping")
    assert response.status_code == 200 and response.json() == {"ready": True}


def test_a_v2_json_request_for_the_model_in_the_custom_attributes(server: str) -> None:
    body = {"inputs": [{"name": "input", "shape": list(DIGITS.shape), "datatype": "FP32", "data": DIGITS.tolist()}]}
    response = httpx.post(
        f"{server}/invocations",
        json=body,
        headers={"X-Amzn-SageMaker-Custom-Attributes": "model=digits-accurate, version=1"},
    )
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["label"] == LABELS.tolist()
    assert "infer;dur=" in response.headers["server-timing"]


def test_npy_in_for_the_target_model_and_npy_or_npz_out(server: str) -> None:
    target = {"x_amzn_sagemaker_target_model": "digits-accurate.tar.gz"}
    before = settled(server, "digits-accurate")
    as_json = invoke(server, npy(DIGITS), "application/x-npy", **target)
    assert as_json.status_code == 200, as_json.text
    assert {o["name"]: o["data"] for o in as_json.json()["outputs"]}["label"] == LABELS.tolist()
    # Timed, counted and refused as any V2 request is.
    assert all(f"{stage};dur=" in as_json.headers["server-timing"] for stage in ("decode", "infer", "encode"))
    assert invoke(server, npy(DIGITS[:, :3]), "application/x-npy", **target).status_code == 422
    # Every front process flushes its counts within FLUSH_SECONDS: wait for both to show.
    deadline = time.monotonic() + 5 * FLUSH_SECONDS
    while True:
        after = answered(server, "digits-accurate", "200"), answered(server, "digits-accurate", "422")
        if (after[0] - before[0], after[1] - before[1]) == (1, 1) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)

    one = invoke(
        server,
        npy(DIGITS),
        "application/x-npy",
        accept="application/x-npy",
        x_amzn_sagemaker_custom_attributes="output=label",
        **target,
    )
    assert one.status_code == 200 and one.headers["content-type"] == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(one.content)), LABELS)

    buffer = io.BytesIO()
    np.savez(buffer, input=DIGITS)
    every = invoke(server, buffer.getvalue(), "application/x-npz", accept="application/x-npz", **target)
    assert every.status_code == 200, every.text
    with np.load(io.BytesIO(every.content)) as outputs:
        assert set(outputs.files) == {"label", "probabilities"}
        np.testing.assert_array_equal(outputs["label"], LABELS)


@pytest.mark.parametrize(
    ("body", "content_type", "headers", "status", "reason"),
    [
        (npy(DIGITS), "application/x-npy", {}, 400, "say which model"),
        (b"not numpy", "application/x-npy", {"x_amzn_sagemaker_target_model": "digits-accurate"}, 400, "not a valid"),
        (npy(DIGITS[:, :10]), "application/x-npy", {"x_amzn_sagemaker_target_model": "digits-accurate"}, 422, "64"),
        (npy(DIGITS), "application/x-npy", {"x_amzn_sagemaker_target_model": "nope.tar.gz"}, 404, "nope"),
    ],
)
def test_bad_invocations_get_a_clear_4xx(
    server: str, body: bytes, content_type: str, headers: dict[str, str], status: int, reason: str
) -> None:
    response = invoke(server, body, content_type, **headers)
    assert response.status_code == status, response.text
    assert reason in response.json()["error"]


def test_one_model_needs_no_header(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    entry = DEMO_MANIFEST.read_text().split("[[models]]")[2]  # digits-accurate alone
    manifest.write_text("[[models]]" + entry.replace('path = "', f'path = "{DEMO_MANIFEST.parent}/'))
    proc, url = start_server(["-m", str(manifest), "--workers", "0"], tmp_path / "serve.log")
    try:
        response = invoke(url, npy(DIGITS), "application/x-npy")
        assert response.status_code == 200, response.text
        assert response.json()["model_name"] == "digits-accurate"
    finally:
        proc.terminate()
        proc.wait(15)


def test_sagemaker_variables_set_workers_and_timeout_unless_fnserve_ones_do() -> None:
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "3", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "90"}
    assert sagemaker_settings(env) == {"parallel_workers": "3", "inference_timeout_seconds": "90"}
    assert sagemaker_settings({**env, "FNSERVE_PARALLEL_WORKERS": "1"}) == {"inference_timeout_seconds": "90"}
    assert sagemaker_settings({}) == {}
