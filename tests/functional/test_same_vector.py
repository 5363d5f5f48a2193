"""The same text, the same vector: the demo's int8 MiniLM gives a text one embedding whatever it is batched with
(alone, beside short texts, beside a long one, in each run the token budget cuts a request into, beside other
callers' requests in the adaptive batcher) and whichever way it comes: OpenAI's route, V2 over HTTP and gRPC, an
SQS job batch and the Lambda API function. A model whose activation scales span the batch fails every check here."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as triton

from fnserve.adapters.lambda_.sqs import create_handler
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.core.codec.tensors import unpack_arrays
from fnserve.core.jobs.messages import job_message
from fnserve.core.jobs.results import job_key
from fnserve.settings import Settings
from fnserve.stores.dynamodb import DynamoResultStore
from tests.embeddings import LONGEST, SENTENCES, LambdaTransport, cosine, v2_embeddings, vectors
from tests.helpers import DEMO_MANIFEST, REPO
from tests.helpers.clouds import Aws
from tests.helpers.functions import load_function
from tests.helpers.serving import Served, stop
from tests.servers import free_port, start_server

# A row's answer depends on that row alone: what differs is the order of float sums, far under this.
ATOL = 1e-5
# Queries, sentences and passages up to the model's 256 tokens, so that a request of them is cut into several runs.
TEXTS = [SENTENCES[i] for i in (0, 3, 17, 40, 99, 150, 200, 241)] + [SENTENCES[LONGEST]]
SHORT = ["hi", "ok go", "yes"]
LONG = " ".join(SENTENCES[:60])  # past 256 tokens: its run is the longest a batch can have


def same(got: np.ndarray, alone: np.ndarray, how: str) -> None:
    drift = float(np.max(np.abs(got - alone)))
    assert drift <= ATOL, f"{how}: max abs diff {drift:.3g} from each text alone, cosine {cosine(got, alone).min():.6f}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("same-vector")
    port = free_port()
    options = ["-m", str(DEMO_MANIFEST), "--grpc-port", str(port), "--workers", "1", "--processes", "1"]
    proc, url = start_server(options, directory / "serve.log", env=dict(os.environ), new_session=True)
    served = Served(proc, f"127.0.0.1:{port}", directory / "serve.log", url)
    try:
        yield served
    finally:
        stop(served)


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def alone(client: openai.OpenAI) -> np.ndarray:
    """Each text in a request of its own: the answer every other way must give."""
    return np.concatenate([embed(client, [text]) for text in TEXTS])


def embed(client: openai.OpenAI, texts: list[str]) -> np.ndarray:
    return vectors(client.embeddings.create(model="minilm-embed", input=texts, encoding_format="float"))


def test_a_text_beside_others_in_one_request(client: openai.OpenAI, alone: np.ndarray) -> None:
    same(embed(client, TEXTS), alone, "all in one request, cut into the budget's runs")
    same(embed(client, TEXTS[::-1])[::-1], alone, "the same request reversed")
    with_short = np.concatenate([embed(client, [text, *SHORT])[:1] for text in TEXTS])
    same(with_short, alone, "beside short texts")
    with_long = np.concatenate([embed(client, [LONG, text])[1:] for text in TEXTS])
    same(with_long, alone, "beside a long text")


def test_a_text_batched_with_other_callers(served: Served, alone: np.ndarray) -> None:
    async def main() -> list[np.ndarray]:
        async with openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=120) as client:
            calls = [client.embeddings.create(model="minilm-embed", input=[t], encoding_format="float") for t in TEXTS]
            calls += [client.embeddings.create(model="minilm-embed", input=[LONG, *SHORT]) for _ in range(4)]
            answers = await asyncio.gather(*calls)
        return [vectors(answer)[0] for answer in answers[: len(TEXTS)]]

    same(np.stack(asyncio.run(main())), alone, "sent at once beside other callers' requests")


def test_v2_over_http_and_grpc(served: Served, alone: np.ndarray) -> None:
    with httpx.Client(base_url=served.url, timeout=120) as http:
        same(v2_embeddings(http, TEXTS), alone, "V2 over HTTP")
        same(v2_embeddings(http, [LONG, *TEXTS])[1:], alone, "V2 over HTTP beside a long text")
    with triton.InferenceServerClient(served.address) as grpc:
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        result = grpc.infer("minilm-embed", [text], outputs=[triton.InferRequestedOutput("embedding")])
        same(result.as_numpy("embedding"), alone, "V2 over gRPC")


def test_the_lambda_api_function(alone: np.ndarray) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
        mp.setenv("POWERTOOLS_METRICS_DISABLED", "true")
        handler = load_function(REPO / "functions" / "api" / "app.py").handler
    for version in ("2.0", "1.0"):
        transport = LambdaTransport(handler, version)
        http = httpx.Client(transport=transport, base_url="https://api.example.com", timeout=120)
        with openai.OpenAI(base_url="https://api.example.com/v1", api_key="unused", http_client=http) as client:
            same(embed(client, TEXTS), alone, f"the Lambda API function (payload {version})")
            with_long = np.concatenate([embed(client, [LONG, text])[1:] for text in TEXTS[:3]])
            same(with_long, alone[:3], f"the Lambda API function beside a long text (payload {version})")


def test_an_sqs_batch_of_text_jobs(aws: Aws, alone: np.ndarray, tmp_path: Path) -> None:
    """Jobs of one text, of several, and of a text beside a long one, in one delivery: the batch processor
    tokenizes them together, sorts them by length and cuts its own runs."""
    jobs = {f"one-{i}": [text] for i, text in enumerate(TEXTS)}
    jobs["all"] = TEXTS
    jobs["with-long"] = [LONG, *TEXTS[:4]]
    bodies = [
        json.dumps(job_message(job_id, "minilm-embed", {"text": np.array(texts, dtype=object)}))
        for job_id, texts in jobs.items()
    ]
    settings = Settings(manifest=DEMO_MANIFEST, results_table=aws.table, results_bucket=aws.bucket)
    assert create_handler(settings=settings)(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    stored = DynamoResultStore(aws.table).get([job_key(job_id) for job_id in jobs])

    def embedding(job_id: str) -> np.ndarray:
        record = stored[job_key(job_id)]
        assert record.payload is not None, record
        return unpack_arrays(record.payload)["embedding"]

    same(np.concatenate([embedding(f"one-{i}") for i in range(len(TEXTS))]), alone, "SQS jobs of one text each")
    same(embedding("all"), alone, "an SQS job of all the texts")
    same(embedding("with-long")[1:], alone[:4], "an SQS job beside a long text")
