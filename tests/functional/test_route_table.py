"""The route table (fnserve.adapters.http.table) is what answers: every route in it answers on the app, before
FastAPI and under a root_path (where FastAPI answers everything), and template.yaml's API routes those it marks
``gateway`` and no other."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cfnlint.decode.cfn_yaml import load

from fnserve.adapters.http.app import create_app
from fnserve.adapters.http.table import ROUTES, Route
from fnserve.bootstrap import build_dataplane
from fnserve.settings import Settings
from tests.helpers import DEMO_MANIFEST, REPO

VALUES = {"name": "digits-accurate", "version": "1", "result_id": "no-such-result", "model": "minilm-embed"}
BODIES = {"v2.infer": b"{}", "openai.embeddings": b"{}", "sagemaker.invocations": b"{}"}


def concrete(route: Route) -> str:
    return re.sub(r"\{(\w+)(?::path)?\}", lambda m: VALUES[m.group(1)], route.path)


@pytest.fixture(scope="module")
def app() -> Iterator[Any]:
    settings = Settings(manifest=str(DEMO_MANIFEST))
    yield create_app(build_dataplane(settings), settings, metrics=lambda: b"# metrics\n")


def unrouted(response: httpx.Response) -> bool:
    """The router's own 404 or 405: no route took the request (a route's 404 names what it did not find)."""
    return response.status_code == 405 or (response.status_code == 404 and "Not Found" in response.text)


@pytest.mark.parametrize("root_path", ["", "/prod"])
def test_every_route_of_the_table_answers(app: Any, root_path: str) -> None:
    async def asked() -> None:
        transport = httpx.ASGITransport(app=app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://fnserve{root_path}") as client:
            for route in ROUTES:
                response = await client.request(route.method, concrete(route), content=BODIES.get(route.endpoint))
                assert not unrouted(response), (route, response.status_code, response.text)
                assert response.status_code < 500, (route, response.status_code, response.text)
            missing = await client.get("/v2/nowhere/at/all")
            assert unrouted(missing)  # the check above can fail

    asyncio.run(asked())


def gateway_routes() -> list[str]:
    template = load(str(REPO / "template.yaml"))
    return [
        r["Properties"]["RouteKey"] for r in template["Resources"].values() if r["Type"] == "AWS::ApiGatewayV2::Route"
    ]


def routed(path: str, key: str) -> bool:
    """Whether API Gateway's route ``key`` (``ANY /v2/{proxy+}``) takes ``path``."""
    _, _, pattern = key.partition(" ")
    if pattern.endswith("/{proxy+}"):
        return path.startswith(pattern.removesuffix("{proxy+}")) and len(path) > len(pattern) - len("{proxy+}")
    return path == pattern


def test_the_api_routes_the_gateway_routes_and_no_other() -> None:
    keys = gateway_routes()
    assert keys
    for route in ROUTES:
        path = concrete(route)
        assert any(routed(path, key) for key in keys) == route.gateway, (route.path, keys)
