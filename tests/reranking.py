"""The demo reranker's test queries: a few words of a sentence it was not trained on, against that sentence and
fifteen other held-out ones (``make reranker`` trains on the first 180 of the demo's sentences)."""

from __future__ import annotations

import random

import httpx

from tests.embeddings import SENTENCES

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
