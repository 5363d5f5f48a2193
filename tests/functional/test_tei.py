"""text-embeddings-inference's routes called unchanged by ``huggingface_hub``'s ``InferenceClient`` and in the shapes
LlamaIndex's and Haystack's TEI clients post: against ``fnserve serve``, the Lambda API function through API
Gateway's v1 and v2 events, and the Cloud Function on functions-framework (Cohere's rerank there too). The served
manifest is the demo's with a DistilBERT classifier of three labels imported beside it (``fnserve import``); each
route's answers are held to the pipeline's own over V2, bad input to TEI's error shape, never a 5xx."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import httpx2
import huggingface_hub
import numpy as np
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.utils._http import default_client_factory

from fnserve.adapters.http.app import create_app
from fnserve.bootstrap import build_dataplane
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.settings import Settings
from tests.embeddings import SENTENCES, Httpx2LambdaTransport, LambdaTransport, cosine, tokens
from tests.helpers import DEMO_MANIFEST, REPO, load_module
from tests.helpers.functions import FUNCTIONS_FRAMEWORK
from tests.moto import free_port
from tests.reranking import MODEL as RERANKER
from tests.reranking import check_ranking, check_refusals, queries
from tests.servers import start_http, start_server

EXPORT_PYTHON = REPO / ".venv-export" / "bin" / "python"
CLASSIFIER = "sentiment-test"
EMBEDDER = "minilm-embed"
TARGETS = ["server", "lambda-http-api", "lambda-rest-api", "cloud-function"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's models and a text classifier imported beside them."""
    if not EXPORT_PYTHON.exists():
        pytest.fail("the export environment (torch, optimum) is missing: make .venv-export/.installed")
    root = tmp_path_factory.mktemp("tei")
    served = root / "models"
    shutil.copytree(DEMO_MANIFEST.parent, served)
    script = REPO / "infra" / "models" / "make_hub_models.py"
    sentences = REPO / "tests" / "data" / "sentences.txt"
    folder = "distilbert-3labels"
    subprocess.run(
        [str(EXPORT_PYTHON), str(script), str(root / "hub"), "--sentences", str(sentences), "--only", folder],
        check=True,
    )
    command = [
        sys.executable,
        "-m",
        "fnserve",
        "import",
        str(root / "hub" / folder),
        "-m",
        str(served / "manifest.toml"),
    ]
    command += ["--name", CLASSIFIER, "--precision", "float", "--export-python", str(EXPORT_PYTHON)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return served / "manifest.toml"


@pytest.fixture(scope="module")
def classifier_length(manifest: Path) -> int:
    """The tokens the classifier reads, as its import wrote them."""
    pipeline = next(p for p in load_manifest(manifest).pipelines if p.name == CLASSIFIER)
    return pipeline.pre[0].max_length  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def served(manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_server(["-m", str(manifest)], tmp_path_factory.mktemp("tei-serve") / "serve.log")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def function(manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``functions-framework --asgi`` serving functions/gcp_api/main.py on the manifest."""
    port = free_port()
    source = REPO / "functions" / "gcp_api" / "main.py"
    command = [FUNCTIONS_FRAMEWORK, "--target", "infer", "--source", str(source), "--signature-type", "http"]
    command += ["--asgi", "--port", str(port), "--host", "127.0.0.1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNSERVE_")}
    env["FNSERVE_MANIFEST"] = str(manifest)
    proc, url = start_http(command, port, tmp_path_factory.mktemp("tei-gcp") / "function.log", env=env)
    yield url
    proc.terminate()
    proc.wait(15)


@pytest.fixture(scope="module")
def handler(manifest: Path) -> object:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FNSERVE_MANIFEST", str(manifest))
        for name in ("FNSERVE_RESULTS", "FNSERVE_RESULTS_TABLE", "FNSERVE_TEI_MODEL"):
            patch.delenv(name, raising=False)
        return load_module(REPO / "functions" / "api" / "app.py", "api_app_tei").handler


@contextlib.contextmanager
def reached(target: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, httpx.Client]]:
    """The target's base URL and an httpx client to it; ``huggingface_hub``'s own client goes there too."""
    if target in ("server", "cloud-function"):
        base = request.getfixturevalue("served" if target == "server" else "function")
        try:
            with httpx.Client(base_url=base, timeout=60) as http:
                yield base, http
        finally:
            huggingface_hub.close_session()
        return
    base = "https://api.example"
    lambda_transport = LambdaTransport(request.getfixturevalue("handler"), "2.0" if "http" in target else "1.0")
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=Httpx2LambdaTransport(lambda_transport)))
    try:
        with httpx.Client(transport=lambda_transport, base_url=base, timeout=60) as http:
            yield base, http
    finally:
        huggingface_hub.set_client_factory(default_client_factory)


def v2(http: httpx.Client, name: str, inputs: dict[str, list[str]], outputs: list[str]) -> dict[str, np.ndarray]:
    body = {
        "inputs": [{"name": k, "shape": [len(v)], "datatype": "BYTES", "data": v} for k, v in inputs.items()],
        "outputs": [{"name": n} for n in outputs],
    }
    response = http.post(f"/v2/models/{name}/infer", json=body)
    assert response.status_code == 200, response.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


@pytest.mark.parametrize("target", TARGETS)
def test_inference_client_embeds_as_the_openai_route_does(target: str, request: pytest.FixtureRequest) -> None:
    texts = SENTENCES[:6]
    with reached(target, request) as (base, http):
        response = http.post("/v1/embeddings", json={"model": EMBEDDER, "input": texts})
        assert response.status_code == 200, response.text
        expected = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
        at_root, prefixed = InferenceClient(base_url=base), InferenceClient(base_url=f"{base}/tei/{EMBEDDER}")
        for i, text in enumerate(texts[:3]):  # POST / with {"inputs": text}: TEI's dispatch to /embed
            vector = at_root.feature_extraction(text)
            assert vector.shape == (1, 384)
            assert float(cosine(vector, expected[i : i + 1])[0]) >= 0.99999
        np.testing.assert_allclose(prefixed.feature_extraction(texts[0], normalize=True), expected[:1], atol=1e-5)
        # LlamaIndex's TextEmbeddingsInference: POST {base}/embed, a batch, truncate on.
        batch = http.post("/embed", json={"inputs": texts, "truncate": True})
        assert batch.status_code == 200, batch.text
        assert batch.headers["x-compute-tokens"].isdigit()
        assert float(cosine(np.array(batch.json(), dtype=np.float32), expected).min()) >= 0.99999
        short = http.post(f"/tei/{EMBEDDER}/embed", json={"inputs": texts[0], "dimensions": 384}).json()
        assert np.array(short).shape == (1, 384)
        # /tokenize: the tokens the model runs, cut as it cuts them, with where each is in the text
        shown = http.post("/tokenize", json={"inputs": ["hello world", "word " * 300]}).json()
        assert [(t["text"], t["special"], t["start"]) for t in shown[0]] == [
            ("[CLS]", True, None),
            ("hello", False, 0),
            ("world", False, 6),
            ("[SEP]", True, None),
        ]
        assert len(shown[1]) == 256 and shown[1][-1]["text"] == "[SEP]"
        assert [t["id"] for t in shown[0]] == tokens("hello world")


@pytest.mark.parametrize("target", TARGETS)
def test_inference_client_classifies_as_the_pipeline_does(target: str, request: pytest.FixtureRequest) -> None:
    texts = SENTENCES[10:14]
    with reached(target, request) as (base, http):
        expected = v2(http, CLASSIFIER, {"text": texts}, ["labels", "scores", "logits"])
        client = InferenceClient(base_url=f"{base}/tei/{CLASSIFIER}")
        for i, text in enumerate(texts):
            labels = client.text_classification(text)  # the Inference API's shape: every label, best first
            assert [e.label for e in labels] == [str(x) for x in expected["labels"][i]]
            np.testing.assert_allclose([e.score for e in labels], expected["scores"][i], rtol=1e-5)
            assert abs(sum(e.score for e in labels) - 1) < 1e-5
        assert len(client.text_classification(texts[0], top_k=1)) == 1
        one = http.post(f"/tei/{CLASSIFIER}/predict", json={"inputs": texts[0]})  # TEI's own: flat for one text
        assert one.status_code == 200, one.text
        assert [e["label"] for e in one.json()] == [str(x) for x in expected["labels"][0]]
        batch = http.post(f"/tei/{CLASSIFIER}/predict", json={"inputs": [[t] for t in texts], "raw_scores": True})
        assert batch.status_code == 200, batch.text
        names = ["negative", "neutral", "positive"]
        for i, row in enumerate(batch.json()):
            raw = {e["label"]: e["score"] for e in row}
            np.testing.assert_allclose([raw[n] for n in names], expected["logits"][i], rtol=1e-5, atol=1e-6)
        info = http.get(f"/tei/{CLASSIFIER}/info").json()
        assert info["model_type"] == {
            "classifier": {
                "id2label": dict(zip("012", names, strict=True)),
                "label2id": {n: i for i, n in enumerate(names)},
            }
        }
        assert info["max_input_length"] == request.getfixturevalue("classifier_length")
        assert http.get(f"/tei/{CLASSIFIER}/health").status_code == 200


@pytest.mark.parametrize("target", TARGETS)
def test_tei_rerank_orders_as_cohere_rerank_and_puts_the_source_first(
    target: str, request: pytest.FixtureRequest
) -> None:
    asked = queries() if target == "server" else queries()[:3]  # the order on every target, the count on one
    firsts = 0
    with reached(target, request) as (base, http):
        co = cohere.ClientV2("unused", base_url=base, httpx_client=http)
        for query, passages in asked:
            cohere_order = [r.index for r in co.rerank(model=RERANKER, query=query, documents=passages).results]
            # Haystack's HuggingFaceTEIRanker: {query, texts, raw_scores}, truncation named.
            body = {"query": query, "texts": passages, "raw_scores": False, "truncate": True}
            response = http.post(f"/tei/{RERANKER}/rerank", json={**body, "truncation_direction": "Right"})
            assert response.status_code == 200, response.text
            ranked = response.json()
            assert [r["index"] for r in ranked] == cohere_order
            assert all(0 < r["score"] < 1 and "text" not in r for r in ranked)
            firsts += ranked[0]["index"] == 0
        assert firsts >= 0.9 * len(asked), f"{firsts} of {len(asked)} queries ranked their source first"
        raw = http.post(f"/tei/{RERANKER}/", json={"query": "warm", "texts": ["a warm container"], "raw_scores": True})
        assert raw.status_code == 200 and raw.json()[0]["score"] > 1  # a logit, through POST / dispatch


def tei_refused(http: httpx.Client, path: str, body: Any, status: int, kind: str, said: str = "") -> None:
    response = http.post(path, json=body) if not isinstance(body, bytes) else http.post(path, content=body)
    assert response.status_code == status, (path, body, response.status_code, response.text)
    doc = response.json()
    assert set(doc) == {"error", "error_type"} and doc["error_type"] == kind, doc
    assert said in doc["error"], doc


@pytest.mark.parametrize("target", ["server", "lambda-http-api", "cloud-function"])
def test_bad_input_is_tei_shaped_and_never_a_5xx(target: str, request: pytest.FixtureRequest) -> None:
    rerank, predict = f"/tei/{RERANKER}/rerank", f"/tei/{CLASSIFIER}/predict"
    with reached(target, request) as (_, http):
        tei_refused(http, "/embed", {"inputs": []}, 400, "Empty")
        tei_refused(http, "/embed", {"inputs": ""}, 422, "Validation", "empty string")
        tei_refused(http, "/embed", {"inputs": 5}, 422, "Validation")
        tei_refused(
            http, "/embed", {"inputs": "a " * 400, "truncate": False}, 422, "Validation", "less than 256 tokens"
        )
        ids = {"inputs": [101] + [7592] * 300 + [102], "truncate": False}
        tei_refused(http, "/embed", ids, 422, "Validation", "Given: 302")
        tei_refused(http, "/embed", {"inputs": "a", "prompt_name": "query"}, 422, "Validation", "prompt_name")
        tei_refused(http, "/embed", {"inputs": "a", "dimensions": 0}, 422, "Validation", "dimensions")
        tei_refused(http, "/embed", {"inputs": "a", "normalize": "yes"}, 422, "Validation", "normalize")
        tei_refused(http, "/embed", {"inputs": ["a"] * 2049}, 422, "Validation", "at most 2048")
        tei_refused(http, "/embed", b"{not json", 400, "Validation", "not valid JSON")
        tei_refused(http, "/rerank", {"query": "q", "texts": ["a"]}, 424, "Backend", "not a reranker")
        tei_refused(http, "/predict", {"inputs": "a"}, 424, "Backend", "not a classifier")
        tei_refused(http, rerank, {"query": "q", "texts": []}, 400, "Empty")
        tei_refused(http, rerank, {"query": "", "texts": ["a"]}, 422, "Validation", "query")
        tei_refused(http, rerank, {"query": "q", "texts": ["a", 3]}, 422, "Validation", "texts")
        tei_refused(http, rerank, {"query": "q", "texts": ["a"], "truncation_direction": "Left"}, 422, "Validation")
        tei_refused(http, predict, {"inputs": ["a", "b"]}, 422, "Validation", "pair")
        tei_refused(http, predict, {"inputs": [["a"], [3]]}, 422, "Validation", "inputs[1]")
        tei_refused(http, "/tei/nope/embed", {"inputs": "a"}, 404, "NotFound", "nope")
        over = http.post("/embed", content=b"x" * (7 << 20))
        assert over.status_code == 413 and over.json()["error_type"] == "Validation"


@pytest.mark.parametrize("target", ["cloud-function"])
def test_the_cohere_client_reranks_on_the_cloud_function(target: str, request: pytest.FixtureRequest) -> None:
    with reached(target, request) as (base, http):
        v1, v2 = (
            cohere.Client("unused", base_url=base, httpx_client=http),
            cohere.ClientV2("unused", base_url=base, httpx_client=http),
        )
        check_ranking(v1, v2, http)
        check_refusals(v2, http)


def test_the_root_serves_the_pipeline_the_setting_names(manifest: Path) -> None:
    async def asked(tei_model: str | None) -> list[httpx.Response]:
        settings = Settings(manifest=str(manifest), tei_model=tei_model)
        plane = build_dataplane(settings)
        transport = httpx.ASGITransport(app=create_app(plane, settings))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
                return [
                    await client.get("/info"),
                    await client.post("/", json={"query": "warm", "texts": ["a warm container", "bananas"]}),
                    await client.post("/", json={"inputs": "warm"}),
                ]
        finally:
            await plane.close()

    def run(tei_model: str | None) -> list[httpx.Response]:
        # A loop of its own: asyncio.run would drop the thread's loop, which Mangum set and an earlier test's handler
        # holds, leaving it unclosed.
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(asked(tei_model))
        finally:
            loop.close()

    info, ranked, embedded = run(RERANKER)
    assert info.json()["model_id"] == RERANKER and "reranker" in info.json()["model_type"]
    assert ranked.status_code == 200 and [r["index"] for r in ranked.json()] == [0, 1]
    assert embedded.status_code == 422  # a reranker reads a query and texts
    info, _, embedded = run(None)  # unset: the manifest's first embedder
    assert info.json()["model_id"] == EMBEDDER and embedded.status_code == 200
    info, _, _ = run("digits-fast")
    assert info.status_code == 500 and "FNSERVE_TEI_MODEL is 'digits-fast'" in info.json()["error"]
