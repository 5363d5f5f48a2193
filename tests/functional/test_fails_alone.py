"""A request whose own input makes onnxruntime fail fails alone: 422 / INVALID_ARGUMENT with the runtime's
reason, and every request batched with it still gets its answer (over HTTP, gRPC and in an SQS batch).

The model is the demo's ``minilm-l6``, which batches (``max_batch_time_ms``); the bad request's token ids
run past its 30,522-token vocabulary, which only onnxruntime's Gather kernel finds out.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from fnserve.adapters.gcp.jobs import Gatherer
from fnserve.adapters.lambda_.sqs import create_handler
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.core.errors import FnserveError, InferenceError, InvalidInput
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.messages import job_message
from fnserve.core.jobs.processor import JobProcessor
from fnserve.core.jobs.results import job_key
from fnserve.core.serving.dataplane import DataPlane
from fnserve.settings import Settings
from fnserve.stores import job_client
from tests.helpers import DEMO_MANIFEST, MemoryStore
from tests.helpers.clouds import Aws
from tests.helpers.serving import Served
from tests.moto import free_port
from tests.servers import start_server

TOKENS = 16
VOCABULARY = 30_522
REASON = "indices element out of data bounds"
SESSION = ort.InferenceSession(str(DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx"))


def feed(seed: int, bad: bool = False) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1000, VOCABULARY, (1, TOKENS))
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    if bad:
        ids[0, 5] = VOCABULARY + 10_000
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def pooled(token_embeddings: np.ndarray) -> np.ndarray:
    """A request's mean token embedding, unit length."""
    mean = token_embeddings.reshape(-1, token_embeddings.shape[-1]).mean(axis=0)
    return mean / np.linalg.norm(mean)  # type: ignore[no-any-return]


ALONE = np.stack([pooled(SESSION.run(None, feed(seed))[0]) for seed in range(9)])  # each request on its own


def close(got: np.ndarray, seed: int) -> bool:
    """Whether ``got`` is the answer to request ``seed``: near what onnxruntime gives it alone, and nearer than
    to any other request's. (Batched, an int8 model's dynamic quantization scales over the whole batch, so
    answers move a little with their neighbours: near, not equal.)"""
    similarity = ALONE @ pooled(got)
    return got.shape == (1, TOKENS, 384) and similarity[seed] > 0.95 and int(np.argmax(similarity)) == seed


def minilm_manifest(directory: Path) -> Path:
    """The demo's minilm-l6 entry as shipped, but with a batching window that a loaded test machine's nine
    threads land in together (the demo's 2 ms is a production setting: under a full test run's load the
    requests can arrive further apart, and a test that never batched the bad request would prove nothing)."""
    entry = next(m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"] if m["name"] == "minilm-l6")
    entry |= {"path": str(DEMO_MANIFEST.parent / entry["path"]), "max_batch_time_ms": 250.0}
    manifest = directory / "manifest.toml"
    manifest.write_text("[[models]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entry.items()))
    return manifest


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``fnserve serve`` in its default layout (one front process, so the requests share its batcher)."""
    directory = tmp_path_factory.mktemp("alone")
    port = free_port()
    options = ["-m", str(minilm_manifest(directory)), "--processes", "1", "--grpc-port", str(port)]
    proc, url = start_server(options, directory / "serve.log")
    yield Served(proc, f"127.0.0.1:{port}", directory / "serve.log", url)
    proc.terminate()
    proc.wait(timeout=30)


def splits(url: str) -> float:
    """Failed minilm-l6 batches the server has split to find their culprit."""
    prefix = 'fnserve_batch_splits_total{model="minilm-l6"}'
    return sum(
        float(line.split()[-1]) for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith(prefix)
    )


def concurrently(call: Any, requests: list[tuple[int, bool]]) -> list[Any]:
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda request: call(*request), requests))


def trial(bad_at: int) -> list[tuple[int, bool]]:
    """Eight valid requests and one whose ids run past the vocabulary, at ``bad_at``."""
    return [(seed, seed == bad_at) for seed in range(9)]


def test_over_http_the_bad_request_gets_422_and_the_others_their_answers(served: Served) -> None:
    def post(seed: int, bad: bool) -> httpx.Response:
        inputs = [
            {"name": name, "shape": [1, TOKENS], "datatype": "INT64", "data": array.ravel().tolist()}
            for name, array in feed(seed, bad).items()
        ]
        return httpx.post(f"{served.url}/v2/models/minilm-l6/infer", json={"inputs": inputs}, timeout=30)

    before = splits(served.url)
    for bad_at in (0, 4, 8):  # three trials, the bad request first, among, and last
        responses = concurrently(post, trial(bad_at))
        for seed, response in enumerate(responses):
            if seed == bad_at:
                assert response.status_code == 422, response.text
                assert REASON in response.json()["error"] and "Gather" in response.json()["error"]
                continue
            assert response.status_code == 200, response.text
            output = response.json()["outputs"][0]
            assert close(np.reshape(output["data"], output["shape"]), seed)
    # Only a proof if the bad request shared batches: the server says it split failed ones.
    assert splits(served.url) > before


@pytest.mark.parametrize("bad_at", [2, 7])
def test_over_grpc_the_bad_request_gets_invalid_argument_and_the_others_their_answers(
    served: Served, bad_at: int
) -> None:
    def infer(seed: int, bad: bool) -> Any:
        inputs = []
        for name, array in feed(seed, bad).items():
            tensor = triton_grpc.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        with triton_grpc.InferenceServerClient(served.address) as client:
            try:
                return client.infer("minilm-l6", inputs).as_numpy("token_embeddings")
            except InferenceServerException as exc:
                return exc

    results = concurrently(infer, trial(bad_at))
    for seed, result in enumerate(results):
        if seed == bad_at:
            assert isinstance(result, InferenceServerException)
            assert result.status() == "StatusCode.INVALID_ARGUMENT" and REASON in result.message()
        else:
            assert not isinstance(result, InferenceServerException), result
            assert close(result, seed)


def test_in_an_sqs_batch_the_bad_job_fails_alone_and_is_not_redelivered(aws: Aws, tmp_path: Path) -> None:
    handler = create_handler(
        settings=Settings(manifest=DEMO_MANIFEST, results_table=aws.table, results_bucket=aws.bucket)
    )
    bodies = [json.dumps(job_message(f"job-{seed}", "minilm-l6", feed(seed, bad))) for seed, bad in trial(3)]
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}  # nothing to redeliver
    found = job_client.fetch_results(aws.table, [f"job-{seed}" for seed in range(9)])
    assert set(found.failed) == {"job-3"} and REASON in found.failed["job-3"]
    assert not found.pending
    for seed in (0, 1, 2, 4, 5, 6, 7, 8):
        assert close(found.done[f"job-{seed}"]["token_embeddings"], seed)


# -- the same poisoned batch through every gatherer, in process ---------------------------------------------------

GATHERERS = ["adaptive batcher", "turn batcher", "sqs batch", "pubsub batch", "many-row requests"]
ROWS = 3  # a many-row request's: the nine requests' rows sent as three requests


def _service(directory: Path, batched: bool) -> InferenceService:
    manifest = minilm_manifest(directory)
    if not batched:  # the turn batcher serves a model that asks for no adaptive batching
        text = manifest.read_text()
        manifest.write_text(
            "".join(line for line in text.splitlines(True) if not line.startswith(("max_batch_time", "length_buckets")))
        )
    return InferenceService.from_manifest(manifest)


def _served_together(service: InferenceService, feeds: list[dict[str, np.ndarray]]) -> tuple[list[Any], int]:
    """Each feed's answer (its token embeddings, or the error it got) from a batching data plane, all asked in one
    turn of the loop; and how many failed runs the runner that ran them halved."""

    async def ask() -> tuple[list[Any], int]:
        plane = DataPlane(service, batching=True)
        try:
            calls = [plane.infer("minilm-l6", f) for f in feeds]
            answers = await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await plane.close()
        runner = plane.batchers["minilm-l6"].runner if plane.batchers else service.runner
        return [a if isinstance(a, BaseException) else a.outputs["token_embeddings"] for a in answers], runner.splits

    return asyncio.run(ask())


def _jobs(handler: str, service: InferenceService) -> list[Any]:
    store = MemoryStore()
    bodies = [json.dumps(job_message(f"job-{seed}", "minilm-l6", feed(seed, bad))) for seed, bad in trial(3)]
    if handler == "sqs batch":
        outcome = create_handler(service, store=store)(sqs_event(bodies), LambdaContext())
        assert outcome == {"batchItemFailures": []}  # nothing to redeliver: the bad job's fault is its own
    else:
        gatherer = Gatherer(JobProcessor(service, store, ttl_seconds=3600), window=0.25, max_jobs=len(bodies))

        async def deliver() -> list[bool]:
            return await asyncio.gather(*(gatherer.redeliver((f"m-{i}", b.encode(), 1)) for i, b in enumerate(bodies)))

        assert not any(asyncio.run(deliver()))  # acknowledged, every one
    records = [store.records[job_key(f"job-{seed}")] for seed in range(9)]
    return [InferenceError(str(r.error)) if r.status == "failed" else r.outputs()["token_embeddings"] for r in records]


@pytest.mark.parametrize("gatherer", GATHERERS)
def test_the_same_poisoned_batch_fails_alone_on_every_gatherer(gatherer: str, tmp_path: Path) -> None:
    """Nine items, the fourth with ids past the vocabulary: it alone fails, with onnxruntime's reason, and every
    other item gets the answer it gets alone, whichever gatherer closed the batch they shared."""
    service = _service(tmp_path, batched=gatherer != "turn batcher")
    feeds = [feed(seed, bad) for seed, bad in trial(3)]
    if gatherer in ("sqs batch", "pubsub batch"):
        results, splits = _jobs(gatherer, service), service.runner.splits
    elif gatherer == "many-row requests":
        requests = [
            {name: np.concatenate([f[name] for f in feeds[start : start + ROWS]]) for name in feeds[0]}
            for start in range(0, len(feeds), ROWS)
        ]
        answers, splits = _served_together(service, requests)
        results = [
            answer if isinstance(answer, BaseException) else answer[row : row + 1]
            for answer in answers
            for row in range(ROWS)
        ]
    else:
        results, splits = _served_together(service, feeds)
    # Only a proof if the bad item shared a run: the runner halved a failed one.
    assert splits > 0
    for seed, result in enumerate(results):
        if gatherer == "many-row requests" and seed // ROWS == 1:  # the request that holds the bad row
            assert isinstance(result, InvalidInput) and REASON in result.message, result
        elif seed == 3:
            assert isinstance(result, FnserveError) and REASON in result.message, result
        else:
            assert not isinstance(result, BaseException), result
            assert close(result, seed)
