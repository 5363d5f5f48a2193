"""Cohere's rerank API (``/v1/rerank``, ``/v2/rerank``) called by the ``cohere`` client unchanged: against ``fnserve
serve`` and the Lambda API function through API Gateway's v1 and v2 events, the demo reranker's order the same as
its V2 scores', bad input answered in Cohere's shape."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import cohere
import httpx
import numpy as np
import pytest

from tests.embeddings import LambdaTransport
from tests.helpers import DEMO_MANIFEST, REPO, load_module
from tests.reranking import queries, v2_scores
from tests.servers import start_server

MODEL = "minilm-rerank"


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


def check_ranking(v1: cohere.Client, v2: cohere.ClientV2, http: httpx.Client) -> None:
    asked = queries()
    firsts = 0
    for query, passages in asked[:8]:
        scores = np.array(v2_scores(http, query, passages))
        answer = v1.rerank(model=MODEL, query=query, documents=passages, top_n=5, return_documents=True)
        assert [r.index for r in answer.results] == np.argsort(-scores, kind="stable")[:5].tolist()
        np.testing.assert_allclose([r.relevance_score for r in answer.results], np.sort(scores)[::-1][:5], rtol=1e-6)
        assert [r.document.text for r in answer.results if r.document] == [passages[r.index] for r in answer.results]
        again = v2.rerank(model=MODEL, query=query, documents=passages)
        assert [r.index for r in again.results] == np.argsort(-scores, kind="stable").tolist()
        firsts += again.results[0].index == 0
    assert firsts >= 7, f"{firsts} of 8 queries ranked their source first"
    # v1 objects with text, and no model: the server's only reranker.
    objects = v1.rerank(
        query="warm containers", documents=[{"text": "A warm container answers."}, {"text": "Bananas."}]
    )
    assert objects.results[0].index == 0


@pytest.mark.parametrize("target", ["server", "lambda-http-api"])
def test_bad_input_is_cohere_shaped_and_never_a_5xx(
    target: str, request: pytest.FixtureRequest, handler: object
) -> None:
    url = request.getfixturevalue("served") if target == "server" else None
    with clients(target, url, handler) as (_, v2, http):
        check_refusals(v2, http)


def check_refusals(v2: cohere.ClientV2, http: httpx.Client) -> None:
    with pytest.raises(cohere.errors.BadRequestError) as empty:
        v2.rerank(model=MODEL, query="q", documents=[])
    assert empty.value.body == {"message": "invalid request: list of documents must not be empty"}
    with pytest.raises(cohere.errors.NotFoundError) as unknown:
        v2.rerank(model="rerank-v3.5", query="q", documents=["a"])
    assert "not found: it reranks with ['minilm-rerank']" in unknown.value.body["message"]
    for body in (
        {"model": MODEL, "query": "", "documents": ["a"]},
        {"model": MODEL, "query": "q", "documents": ["a", 3]},
        {"model": MODEL, "query": "q", "documents": ["a"], "top_n": 0},
        {"model": MODEL, "query": "q", "documents": "a"},
        {"model": MODEL, "query": "q", "documents": ["a"] * 10_001},
    ):
        response = http.post("/v1/rerank", json=body)
        assert response.status_code == 400, (body, response.text)
        assert set(response.json()) == {"message"}
    named = http.post("/v1/rerank", json={"model": [MODEL], "query": "q", "documents": ["a"]})
    assert named.status_code == 404 and "not found" in named.json()["message"]  # a model that is not a name
    broken = http.post("/v2/rerank", content=b"{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["message"]


def test_the_route_is_in_the_metrics_as_every_route_is(served: str) -> None:
    with clients("server", served, None) as (v1, _, http):
        v1.rerank(model=MODEL, query="warm", documents=["a warm container", "bananas"])
        assert f'model="{MODEL}"' in http.get("/metrics").text
