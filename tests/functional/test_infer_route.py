"""The inference route's two roads: V2App's direct ASGI answer and the FastAPI route must agree.

A request under a ``root_path`` (a mounted app) takes the FastAPI route; every other one the
direct road. Both must give the same status, body and headers, success or refusal, and an
unexpected error on either is a logged 500 that does not harm the next request.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import httpx
import numpy as np
import pytest

from fnserve.adapters.http.app import create_app
from fnserve.core.execution.service import InferenceService
from fnserve.core.serving.dataplane import DataPlane
from fnserve.settings import Settings
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST

X = np.load(DEMO_HOLDOUT)["input"][:3]
BODY = {"inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32", "data": X.ravel().tolist()}]}


@pytest.fixture(scope="module")
def plane() -> DataPlane:
    return DataPlane(InferenceService.from_manifest(DEMO_MANIFEST, eager=True))


def call(plane: DataPlane, path: str, root_path: str = "", **kwargs: Any) -> httpx.Response:
    app = create_app(plane, Settings(manifest=DEMO_MANIFEST, access_log=True, max_request_bytes=4096))

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
            return await client.post(root_path + path, **kwargs)

    return asyncio.run(main())


def both(plane: DataPlane, path: str, **kwargs: Any) -> tuple[httpx.Response, httpx.Response]:
    return call(plane, path, **kwargs), call(plane, path, root_path="/stage", **kwargs)


def comparable(response: httpx.Response) -> tuple[int, bytes, dict[str, str]]:
    headers = {k: v for k, v in response.headers.items() if k != "server-timing"}
    stages = [part.split(";")[0].strip() for part in response.headers.get("server-timing", "").split(",")]
    return response.status_code, response.content, {**headers, "server-timing": ",".join(stages)}


@pytest.mark.parametrize(
    ("path", "kwargs", "status"),
    [
        ("/v2/models/digits-accurate/infer", {"json": BODY}, 200),
        ("/v2/models/digits-accurate/versions/1/infer", {"json": BODY}, 200),
        ("/v2/models/digits-accurate/infer", {"json": {**BODY, "outputs": [{"name": "label"}]}}, 200),
        ("/v2/models/digits-accurate/infer", {"content": b"{"}, 400),
        ("/v2/models/nope/infer", {"json": BODY}, 404),
        ("/v2/models/digits-accurate/versions/9/infer", {"json": BODY}, 404),
        ("/v2/models/digits-accurate/infer", {"content": b" " * 5000}, 413),
        ("/v2/models/digits-accurate/infer", {"json": BODY, "headers": {"inference-header-content-length": "x"}}, 400),
    ],
)
def test_both_roads_give_the_same_answer(plane: DataPlane, path: str, kwargs: dict[str, Any], status: int) -> None:
    headers = {"x-request-id": "same-id", **kwargs.pop("headers", {})}
    direct, routed = both(plane, path, headers=headers, **kwargs)
    assert direct.status_code == status, direct.text
    assert comparable(direct) == comparable(routed)
    assert direct.headers["x-request-id"] == "same-id"
    if status >= 400:
        assert direct.headers["content-type"] == "application/json" and direct.json()["error"]


def test_binary_answers_agree(plane: DataPlane) -> None:
    head = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [3, 64], "datatype": "FP32", "parameters": {"binary_data_size": 768}}
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {"inference-header-content-length": str(len(head)), "x-request-id": "bin"}
    direct, routed = both(
        plane, "/v2/models/digits-accurate/infer", content=head + X.astype(np.float32).tobytes(), headers=headers
    )
    assert direct.status_code == 200 and direct.headers["content-type"] == "application/octet-stream"
    assert comparable(direct) == comparable(routed)
    assert int(direct.headers["inference-header-content-length"]) < len(direct.content)


def test_other_methods_and_paths_fall_through_to_the_router(plane: DataPlane) -> None:
    app = create_app(plane, Settings(manifest=DEMO_MANIFEST))

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
            return [
                await client.get("/v2/models/digits-accurate/infer"),
                await client.post("/v2/models//infer", json=BODY),
                await client.post("/v2/models/digits-accurate/versions/1/2/infer", json=BODY),
                await client.post("/v2/models/digits-accurate/other/1/infer", json=BODY),
            ]

    statuses = [r.status_code for r in asyncio.run(main())]
    assert statuses == [405, 404, 404, 404]


def test_an_unexpected_error_is_a_logged_500_on_both_roads(
    plane: DataPlane, log_stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = plane.infer

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(plane, "infer", broken)
    direct, routed = both(plane, "/v2/models/digits-accurate/infer", json=BODY, headers={"x-request-id": "r-500"})
    for response in (direct, routed):
        assert response.status_code == 500
        assert response.json() == {"error": "internal server error"}
        assert response.headers["x-request-id"] == "r-500"
    errors = [json.loads(line) for line in log_stream.getvalue().splitlines() if "unhandled error" in line]
    assert len(errors) == 2 and all("RuntimeError: boom" in e["exception"] for e in errors)
    assert all(e["request_id"] == "r-500" for e in errors)

    monkeypatch.setattr(plane, "infer", real)
    assert call(plane, "/v2/models/digits-accurate/infer", json=BODY).status_code == 200


@pytest.mark.parametrize(
    ("root_path", "path"),
    [
        ("", "/v2/models/digits-accurate/infer"),  # the direct road
        ("/stage", "/stage/v2/models/digits-accurate/infer"),  # FastAPI's route
        ("", "/invocations"),  # SageMaker's
    ],
)
def test_a_client_that_disconnects_mid_body_gets_no_answer_and_harms_nothing(
    plane: DataPlane, log_stream: io.StringIO, root_path: str, path: str
) -> None:
    app = create_app(plane, Settings(manifest=DEMO_MANIFEST))
    sent: list[dict[str, Any]] = []
    messages = iter([{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "root_path": root_path,
        # SageMaker's target: with many models it must say which before the body is read
        "headers": [(b"content-type", b"application/json"), (b"x-amzn-sagemaker-target-model", b"digits-accurate")],
        "query_string": b"",
    }
    asyncio.run(app(scope, receive, send))
    assert sent == []
    assert "unhandled error" not in log_stream.getvalue()  # nobody to answer is not the server's fault
    assert call(plane, "/v2/models/digits-accurate/infer", json=BODY).status_code == 200


def test_concurrent_requests_to_the_server_app_each_get_their_own_rows_from_fewer_runs() -> None:
    """The server's data plane (``batching=True``) runs the requests that arrive together as one call: twelve
    concurrent requests over its ASGI app, each a different digit (and one a bad one), each answered with its own
    label, the bad one alone refused, in fewer runs of the model than requests (Triton's statistics say so)."""
    from fnserve.bootstrap import build_dataplane

    settings = Settings(manifest=DEMO_MANIFEST)
    app = create_app(build_dataplane(settings, batching=True), settings)
    rows = np.load(DEMO_HOLDOUT)["input"][:12]
    expected = ort_labels(rows)

    def body(row: np.ndarray, width: int = 64) -> dict[str, Any]:
        return {"inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32", "data": row[:width].tolist()}]}

    async def main() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fnserve") as client:
            url = "/v2/models/digits-accurate/infer"
            bodies = [body(row, 63 if i == 5 else 64) for i, row in enumerate(rows)]
            answers = await asyncio.gather(*(client.post(url, json=b) for b in bodies))
            return answers, await client.get("/v2/models/digits-accurate/stats")

    answers, stats = asyncio.run(main())
    assert answers[5].status_code == 422 and "input" in answers[5].json()["error"]
    for i, answer in enumerate(answers):
        if i != 5:
            assert answer.status_code == 200, answer.text
            label = next(o for o in answer.json()["outputs"] if o["name"] == "label")["data"]
            assert label == [int(expected[i])], i
    counts = stats.json()["model_stats"][0]
    assert counts["inference_count"] == 11 and counts["execution_count"] < 11


def ort_labels(rows: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))
    return session.run(["label"], {"input": rows.astype(np.float32)})[0]  # type: ignore[no-any-return]
