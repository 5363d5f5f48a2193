"""V2App's own roads: health checks answered without FastAPI, as its routes answer them, and the lifespan that
starts a server's companions, builds FastAPI in a thread once the server answers, and stops everything in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from fnserve.adapters.http.app import create_app
from fnserve.adapters.http.infer import V2App
from fnserve.bootstrap import build_dataplane
from fnserve.settings import Settings
from tests.helpers import write_test_manifest
from tests.servers import wait_for


@pytest.fixture
def app(tmp_path: Path) -> V2App:
    settings = Settings(manifest=str(write_test_manifest(tmp_path)), access_log=False)
    return create_app(build_dataplane(settings), settings)


def get(app: Any, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(main())


def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
            return await client.post(path, json=body)

    return asyncio.run(main())


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/ping"])
@pytest.mark.parametrize("ready", [True, False])
def test_health_checks_are_answered_without_fastapi_as_its_routes_answer_them(
    app: V2App, path: str, ready: bool
) -> None:
    app.inference.plane.catalog.ready_when(lambda: ready)
    answer = get(app, path, {"x-request-id": "probe-1"})
    assert app._fastapi is None  # nothing imported or built for it
    routed = get(app.fastapi(), path, {"x-request-id": "probe-1"})
    assert (answer.status_code, answer.json()) == (routed.status_code, routed.json())
    assert answer.status_code == (503 if path != "/v2/health/live" and not ready else 200)
    assert answer.headers["x-request-id"] == routed.headers["x-request-id"] == "probe-1"
    assert answer.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert get(app, path).headers["x-request-id"]  # one made where the caller sent none


class Companion:
    def __init__(self, name: str, events: list[str], fails: bool = False) -> None:
        self.name, self.events, self.fails = name, events, fails

    async def start(self) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    async def stop(self) -> None:
        self.events.append(f"stop {self.name}")


def lifespan(app: V2App) -> list[dict[str, Any]]:
    """Startup then shutdown through ``app``'s lifespan, as uvicorn sends them; the app's messages back."""
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "lifespan.startup"})

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "lifespan.startup.complete":
                await inbox.put({"type": "lifespan.shutdown"})

        await app({"type": "lifespan"}, inbox.get, send)

    asyncio.run(main())
    return sent


def test_the_lifespan_starts_companions_builds_fastapi_after_the_first_answer_and_stops_in_reverse(
    tmp_path: Path,
) -> None:
    settings = Settings(manifest=str(write_test_manifest(tmp_path)), access_log=False)
    events: list[str] = []
    companions = [Companion("grpc", events), Companion("metrics", events)]
    app = create_app(
        build_dataplane(settings), settings, companions=companions, on_shutdown=lambda: events.append("shutdown")
    )
    app.after_first_answer.append(lambda: events.append(f"after the first answer, FastAPI {app._fastapi is not None}"))
    sent = lifespan(app)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert events == ["start grpc", "start metrics", "stop metrics", "stop grpc", "shutdown"]
    # Not while a cold start's first request is in flight: its imports would take the GIL from that request.
    assert get(app, "/v2/health/ready").status_code == 200 and app._fastapi is None
    inputs = [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]
    answer = post(app, "/v2/models/digits-fast/infer", {"inputs": inputs})
    assert answer.status_code == 200, answer.text
    wait_for(lambda: app._fastapi is not None, 30, "FastAPI built in its thread")
    wait_for(lambda: events[-1] == "after the first answer, FastAPI True", 30, "what waits for the first answer")
    post(app, "/v2/models/digits-fast/infer", {"inputs": inputs})
    assert events.count("after the first answer, FastAPI True") == 1  # once


def test_a_companion_that_cannot_start_fails_the_start_and_the_started_ones_stop(tmp_path: Path) -> None:
    settings = Settings(manifest=str(write_test_manifest(tmp_path)), access_log=False)
    events: list[str] = []
    companions = [Companion("grpc", events), Companion("metrics", events, fails=True), Companion("late", events)]
    app = create_app(
        build_dataplane(settings), settings, companions=companions, on_shutdown=lambda: events.append("shutdown")
    )
    sent = lifespan(app)
    assert sent == [{"type": "lifespan.startup.failed", "message": "RuntimeError: metrics cannot start"}]
    assert events == ["start grpc", "stop grpc", "shutdown"]
