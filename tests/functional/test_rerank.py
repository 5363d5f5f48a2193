"""Cohere's rerank API (``/v1/rerank``, ``/v2/rerank``) called by the ``cohere`` client unchanged: against ``fnserve
serve`` and the Lambda API function through API Gateway's v1 and v2 events, the demo reranker's order the same as
its V2 scores', bad input answered in Cohere's shape."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import cohere
import httpx
import pytest

from tests.embeddings import LambdaTransport
from tests.helpers import DEMO_MANIFEST, REPO, load_module
from tests.reranking import MODEL, check_ranking, check_refusals
from tests.servers import start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_server(["-m", str(DEMO_MANIFEST)], tmp_path_factory.mktemp("rerank") / "serve.log")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def handler() -> object:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
        for name in ("FNSERVE_RESULTS", "FNSERVE_RESULTS_TABLE"):
            patch.delenv(name, raising=False)
        return load_module(REPO / "functions" / "api" / "app.py", "api_app_rerank").handler


@contextlib.contextmanager
def clients(
    target: str, url: str | None, handler: object
) -> Iterator[tuple[cohere.Client, cohere.ClientV2, httpx.Client]]:
    """The cohere clients, v1 and v2, and an httpx client to the same target, all on one connection pool."""
    if target == "server":
        assert url is not None
        base, transport = url, httpx.HTTPTransport()
    else:
        base, transport = (
            "https://api.example",
            LambdaTransport(handler, "2.0" if target == "lambda-http-api" else "1.0"),
        )  # type: ignore[arg-type]
    with httpx.Client(transport=transport, base_url=base, timeout=60) as http:
        yield (
            cohere.Client("unused", base_url=base, httpx_client=http),
            cohere.ClientV2("unused", base_url=base, httpx_client=http),
            http,
        )


@pytest.mark.parametrize("target", ["server", "lambda-http-api", "lambda-rest-api"])
def test_the_cohere_client_reranks_as_the_pipeline_scores(
    target: str, request: pytest.FixtureRequest, handler: object
) -> None:
    url = request.getfixturevalue("served") if target == "server" else None
    with clients(target, url, handler) as (v1, v2, http):
        check_ranking(v1, v2, http)


@pytest.mark.parametrize("target", ["server", "lambda-http-api"])
def test_bad_input_is_cohere_shaped_and_never_a_5xx(
    target: str, request: pytest.FixtureRequest, handler: object
) -> None:
    url = request.getfixturevalue("served") if target == "server" else None
    with clients(target, url, handler) as (_, v2, http):
        check_refusals(v2, http)


def test_the_route_is_in_the_metrics_as_every_route_is(served: str) -> None:
    with clients("server", served, None) as (v1, _, http):
        v1.rerank(model=MODEL, query="warm", documents=["a warm container", "bananas"])
        assert f'model="{MODEL}"' in http.get("/metrics").text
