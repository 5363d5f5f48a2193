"""How many of fnserve's files a request passes through, from its entry to the onnxruntime call.

Each path's request is sent through its real entry (the server's ASGI app, the Lambda handlers,
the gRPC servicer); the model's session records the stack it is called from, and the fnserve
files on it are the path. docs/architecture.md lists them; the design's target is
at most five.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import fnserve
from fnserve.adapters.grpc import codec
from fnserve.adapters.grpc.proto import open_inference_grpc_pb2 as pb
from fnserve.adapters.grpc.service import InferenceServicer
from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_ import http as lambda_http
from fnserve.adapters.lambda_ import sqs as lambda_sqs
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.bootstrap import build_dataplane, build_service
from fnserve.core.jobs import job_message
from fnserve.core.service import InferenceService
from fnserve.settings import Settings
from tests.helpers import DEMO_HOLDOUT, REPO, MemoryStore, close_main_loop, write_test_manifest

PACKAGE = Path(fnserve.__file__).parent
MOST = 5
DIGITS = np.load(DEMO_HOLDOUT)["input"]


class Recorded:
    """Wraps a model's session: every run records the fnserve files on the stack that called it."""

    def __init__(self, service: InferenceService, model: str) -> None:
        self.loaded = service.registry.get(model)
        self.session = self.loaded.session
        self.paths: list[list[str]] = []

    def run(self, names: Any, feed: Any) -> Any:
        files: list[str] = []
        for frame in traceback.extract_stack()[:-1]:
            path = Path(frame.filename)
            if path.is_relative_to(PACKAGE):
                relative = path.relative_to(PACKAGE).as_posix()
                if relative not in files:
                    files.append(relative)
        self.paths.append(files)
        return self.session.run(names, feed)

    def __enter__(self) -> Recorded:
        object.__setattr__(self.loaded, "session", self)  # a frozen dataclass: the registry's own object
        return self

    def __exit__(self, *_: object) -> None:
        object.__setattr__(self.loaded, "session", self.session)


def v2_body(rows: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}]}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_manifest(tmp_path_factory.mktemp("paths"), cascade=True)


@pytest.fixture(scope="module")
def unsure_row(manifest: Path) -> np.ndarray:
    """One digit the fast model is unsure of: the cascade follows it up."""
    from fnserve.core.cascade import confidence

    service = InferenceService.from_manifest(manifest)
    cascade = service.registry.manifest.cascades[0]
    scores = service.predict(cascade.fast, {"input": DIGITS})["probabilities"]
    row = int(np.flatnonzero(confidence(scores, cascade) < cascade.threshold)[0])
    return DIGITS[row : row + 1]


def through(service: InferenceService, model: str, call: Callable[[], Any]) -> list[str]:
    with Recorded(service, model) as recorded:
        call()
    assert len(recorded.paths) == 1, recorded.paths
    return recorded.paths[0]


def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fnserve") as client:
            return await client.post(path, json=body)

    return asyncio.run(send())


def api_event(model: str, rows: np.ndarray) -> dict[str, Any]:
    event = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/v2/models/{model}/infer"
    event["body"] = json.dumps(v2_body(rows))
    event["headers"]["content-length"] = str(len(event["body"]))
    return event


PATHS: dict[str, list[str]] = {}  # what each test found, for the summary below


@pytest.fixture(scope="module", autouse=True)
def summary() -> Iterator[None]:
    yield
    for name, files in PATHS.items():
        print(f"{name}: {len(files)} files: {' -> '.join(files)}")


def test_serve_http(manifest: Path) -> None:
    """``fnserve serve``'s front process runs the models itself (the default layout): its ASGI app, in process.
    A lone request leads its turn of the event loop (``core/turns.py``) and runs the session in its own task."""
    plane = build_dataplane(Settings(manifest=str(manifest)), batching=True)
    app = create_app(plane, Settings(manifest=str(manifest), access_log=True))
    path = through(
        plane.service, "digits-accurate", lambda: post(app, "/v2/models/digits-accurate/infer", v2_body(DIGITS[:1]))
    )
    PATHS["serve HTTP"] = path
    assert path[0] == "adapters/http/infer.py" and "core/turns.py" in path and path[-1] == "core/servable.py"
    assert len(path) <= MOST, path


def test_lambda_api(manifest: Path) -> None:
    settings = Settings(manifest=str(manifest))
    service = build_service(settings)
    handler = lambda_http.create_handler(service=service, settings=settings)
    response: dict[str, Any] = {}
    path = through(
        service,
        "digits-accurate",
        lambda: response.update(handler(api_event("digits-accurate", DIGITS[:1]), LambdaContext())),
    )
    close_main_loop()  # Mangum's, before another test's asyncio.run leaves it to the collector
    assert response["statusCode"] == 200, response
    PATHS["Lambda API"] = path
    assert path[0] == "adapters/lambda_/http.py" and len(path) <= MOST, path


def test_sqs_job(manifest: Path) -> None:
    settings = Settings(manifest=str(manifest))
    service = build_service(settings)
    handler = lambda_sqs.create_handler(service=service, settings=settings, store=MemoryStore())
    event = sqs_event([json.dumps(job_message("j", "digits-accurate", {"input": DIGITS[:2]}))])
    path = through(service, "digits-accurate", lambda: handler(event, LambdaContext()))
    PATHS["SQS job"] = path
    assert path[0] == "adapters/lambda_/sqs.py" and len(path) <= MOST, path


def test_cascade_and_its_follow_up(manifest: Path, unsure_row: np.ndarray) -> None:
    """The request to a cascade runs the fast model; its follow-up, a job for the slow one, the batch function."""
    plane = build_dataplane(Settings(manifest=str(manifest)))
    app = create_app(plane, Settings(manifest=str(manifest)))
    request = through(plane.service, "digits-fast", lambda: post(app, "/v2/models/digits/infer", v2_body(unsure_row)))
    settings = Settings(manifest=str(manifest))
    service = build_service(settings)
    handler = lambda_sqs.create_handler(service=service, settings=settings, store=MemoryStore())
    event = sqs_event([json.dumps(job_message("f", "digits-accurate", {"input": unsure_row}))])
    followup = through(service, "digits-accurate", lambda: handler(event, LambdaContext()))
    PATHS["cascade request"], PATHS["cascade follow-up"] = request, followup
    assert "core/cascade.py" in request and len(request) <= MOST, request
    assert len(followup) <= MOST, followup


class Context:
    """What ModelInfer reads of grpc.aio's servicer context."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float:
        return 30.0

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = metadata

    async def abort(self, code: Any, message: str) -> None:
        raise AssertionError(f"{code}: {message}")


def test_grpc(manifest: Path) -> None:
    plane = build_dataplane(Settings(manifest=str(manifest)), batching=True)  # the server's, as HTTP's above
    servicer = InferenceServicer(plane, access_log=True)
    request = pb.ModelInferRequest(model_name="digits-accurate")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(DIGITS[:1].tobytes())
    parsed = codec.parse_request(request.SerializeToString())
    path = through(plane.service, "digits-accurate", lambda: asyncio.run(servicer.ModelInfer(parsed, Context())))
    PATHS["gRPC"] = path
    assert path[0] == "adapters/grpc/service.py" and "core/turns.py" in path and len(path) <= MOST, path
