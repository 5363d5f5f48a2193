"""OpenAI's embeddings API on ``fnserve serve``, called by the official ``openai`` client (sync and async)."""

from __future__ import annotations

import asyncio
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from fnserve.core.execution.embeddings import shorten
from tests.embeddings import (
    MIXED,
    SENTENCES,
    check_client,
    cosine,
    tokens,
    v2_embeddings,
    vectors,
)
from tests.helpers import DEMO_MANIFEST
from tests.servers import start_server


def embedding_manifest(directory: Path) -> Path:
    """The demo's MiniLM and its embedding pipeline (cached), and the same model declared as cut to 128 or 256
    dimensions (a Matryoshka model's declaration, to test the cut)."""
    demo = tomllib.loads(DEMO_MANIFEST.read_text())
    model = next(m for m in demo["models"] if m["name"] == "minilm-l6")
    tokenizer = DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"
    pipeline = f'''model = "minilm-l6"
[[pipelines.pre]]
step = "tokenize"
tokenizer = "{tokenizer}"
max_length = 256
[[pipelines.post]]
step = "mean_pool"
'''
    path = directory / "manifest.toml"
    path.write_text(
        f'''[[models]]
name = "minilm-l6"
path = "{DEMO_MANIFEST.parent / model["path"]}"
sha256 = "{model["sha256"]}"
max_batch_size = 64
max_batch_time_ms = 2.0
length_buckets = [16, 32, 64, 128, 256]
pad_inputs = ["input_ids", "attention_mask", "token_type_ids"]

[[pipelines]]
name = "minilm-embed"
cache_ttl_seconds = 60
{pipeline}
[[pipelines]]
name = "minilm-matryoshka"
embedding = {{ dimensions = [128, 256] }}
{pipeline}'''
    )
    return path


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("openai")
    options = ["-m", str(embedding_manifest(directory)), "--workers", "1", "--processes", "1"]
    proc, url = start_server(options, directory / "serve.log", env=dict(os.environ))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60) as client:
        yield client


def test_the_openai_client_against_the_server(client: openai.OpenAI, url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        check_client(client, http)
    assert {m.id for m in client.models.list()} == {"minilm-embed", "minilm-matryoshka"}


def test_the_async_client_with_many_requests_at_once(url: str) -> None:
    texts = [SENTENCES[i] for i in MIXED]

    async def main() -> list[np.ndarray]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60)
        async with client:
            calls = [client.embeddings.create(model="minilm-matryoshka", input=text) for text in texts]
            return [vectors(r)[0] for r in await asyncio.gather(*calls)]

    got = np.stack(asyncio.run(main()))
    with httpx.Client(base_url=url, timeout=60) as http:
        expected = np.concatenate([v2_embeddings(http, [text], "minilm-matryoshka") for text in texts])
    # Batched with one another by the server, as the V2 texts were not: int8's scales follow the batch.
    assert cosine(got, expected).min() > 0.98


def test_dimensions_cut_to_a_declared_length_and_renormalise(client: openai.OpenAI, url: str) -> None:
    texts = [SENTENCES[i] for i in MIXED[:4]]
    with httpx.Client(base_url=url, timeout=60) as http:
        full = v2_embeddings(http, texts, "minilm-matryoshka")
    for size in (128, 256, 384):
        got = vectors(client.embeddings.create(model="minilm-matryoshka", input=texts, dimensions=size))
        assert got.shape == (4, size)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
        assert cosine(got, shorten(full, size)).min() >= 0.9999
    with pytest.raises(openai.BadRequestError, match="128, 256, 384"):
        client.with_options(max_retries=0).embeddings.create(model="minilm-matryoshka", input="x", dimensions=64)
    # The demo's own MiniLM declares no cut.
    with pytest.raises(openai.BadRequestError, match="dimensions=128"):
        client.with_options(max_retries=0).embeddings.create(model="minilm-embed", input="x", dimensions=128)


def test_a_repeated_text_is_a_cache_hit(url: str) -> None:
    body = {"model": "minilm-embed", "input": ["a chunk every document repeats"]}
    with httpx.Client(base_url=url, timeout=60) as http:
        first = http.post("/v1/embeddings", json=body)
        second = http.post("/v1/embeddings", json=body)
    assert (first.headers["x-fnserve-cache"], second.headers["x-fnserve-cache"]) == ("miss", "hit")
    assert first.json() == second.json()
    assert first.json()["usage"]["prompt_tokens"] == len(tokens(body["input"][0]))  # type: ignore[index]


def test_a_long_text_is_cut_and_says_so(url: str) -> None:
    long_text = "serverless " * 400
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = http.post("/v1/embeddings", json={"model": "minilm-embed", "input": ["short", long_text]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-fnserve-truncated"] == "1"
    assert answer.json()["usage"]["prompt_tokens"] == len(tokens("short")) + 256


def test_bad_bodies_are_openai_errors_not_5xx(client: openai.OpenAI, url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        for body in (b"{", b"[]", b'{"input": "x"}', b'{"model": 5, "input": "x"}', b'{"model": "minilm-embed"}'):
            answer = http.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 400, (body, answer.text)
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
        answer = http.post("/v1/embeddings", json={"model": "nope", "input": "x"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
        assert http.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_embeddings_are_counted_logged_and_traced_like_v2(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = http.post(
            "/v1/embeddings", json={"model": "minilm-embed", "input": "counted"}, headers={"x-request-id": "emb-1"}
        )
        assert answer.status_code == 200 and answer.headers["x-request-id"] == "emb-1"
        metrics = http.get("/metrics").text
    counted = [
        line for line in metrics.splitlines() if line.startswith("fnserve_requests_total") and "minilm-embed" in line
    ]
    assert counted and any('status="200"' in line for line in counted), counted
