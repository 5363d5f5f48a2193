"""The demo reranker's test queries: a few words of a sentence it was not trained on, against that sentence and
fifteen other held-out ones (``make reranker`` trains on the first 180 of the demo's sentences)."""

from __future__ import annotations

import random

import cohere
import httpx
import numpy as np
import pytest

from tests.embeddings import SENTENCES

MODEL = "minilm-rerank"  # the demo's reranker
HELD_OUT = SENTENCES[180:]
PASSAGES = 16


def queries() -> list[tuple[str, list[str]]]:
    """Each test query and its passages, the one it came from first."""
    rng = random.Random(7)
    out = []
    for i in range(0, len(HELD_OUT), 3):
        words = [w.strip(".,;:!?()\"'") for w in HELD_OUT[i].split()]
        content = [w for w in words if len(w) > 3]
        query = " ".join(content[1:4]) if len(content) >= 4 else " ".join(words[:4])
        others = rng.sample([s for j, s in enumerate(HELD_OUT) if j != i], PASSAGES - 1)
        out.append((query, [HELD_OUT[i], *others]))
    return out


def v2_scores(http: httpx.Client, query: str, passages: list[str], name: str = "minilm-rerank") -> list[float]:
    """The reranker's scores of ``passages`` for ``query`` through V2."""
    n = len(passages)
    body = {
        "inputs": [
            {"name": "query", "shape": [n], "datatype": "BYTES", "data": [query] * n},
            {"name": "document", "shape": [n], "datatype": "BYTES", "data": passages},
        ],
        "outputs": [{"name": "score"}],
    }
    response = http.post(f"/v2/models/{name}/infer", json=body)
    assert response.status_code == 200, response.text
    return [float(x) for x in response.json()["outputs"][0]["data"]]


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
