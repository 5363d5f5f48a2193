"""The benchmarks' lean batching server (``tests/bench/lean_batch_server.py``) computes what the servers it floors
compute: a floor that did less (a batch cut short, a text left unpooled) would flatter fnserve beside it, and one
that did more (the tokenizer file's own padding of every text to 128 tokens) would hide what fnserve costs."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest

from tests.bench._embed import embed, tokenizer_from
from tests.helpers import DEMO_MANIFEST
from tests.moto import free_port
from tests.servers import start_http

pytestmark = pytest.mark.slow
MODEL = DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx"
TOKENIZER = DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json"


def lean(tmp_path: Path, *options: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.bench.lean_batch_server", "--port", str(port), "--processes", "1", *options]
    proc, url = start_http(
        cmd, port, tmp_path / "lean.log", {**os.environ, "PLAIN_MODEL_PATH": str(MODEL)}, ready_path="/"
    )
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture()
def tensors(tmp_path: Path) -> Iterator[str]:
    yield from lean(tmp_path, "--max-batch", "2", "--queue", "2")


@pytest.fixture()
def texts(tmp_path: Path) -> Iterator[str]:
    yield from lean(tmp_path, "--tokenizer", str(TOKENIZER), "--buckets", "12,16,24,32")


def tensor_request(seed: int) -> tuple[bytes, dict[str, np.ndarray]]:
    ids = np.random.default_rng(seed).integers(1000, 30000, (1, 16))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT64", "data": a.ravel().tolist()} for n, a in feed.items()]
    return orjson.dumps({"inputs": inputs}), feed


async def burst(url: str, bodies: list[bytes]) -> list[tuple[int, bytes, bytes]]:
    """Every body sent at once, each on a connection of its own opened beforehand: (status, Retry-After, body)."""
    port = int(url.rsplit(":", 1)[1])
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in bodies]
    for (_, writer), body in zip(connections, bodies, strict=True):
        head = f"POST /v2/models/minilm-l6/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
    answers = []
    for reader, writer in connections:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        fields = {k.lower(): v for k, v in fields.items()}
        body = await reader.readexactly(int(fields["content-length"]))
        answers.append((int(head[9:12]), fields.get("retry-after", "").encode(), body))
        writer.close()
    return answers


def test_its_batches_answer_each_request_the_models_own_outputs_and_refuse_past_the_queue(tensors: str) -> None:
    """40 requests at once, batches of 2 and a queue of 2: the ones let in get what the model computes for their own
    tokens (the int8 model quantizes its activations over the whole batch, so a row run beside another is close to
    its run alone, not equal: each answer is nearest its own request's run of all 40, at a cosine over 0.95 where
    the others' are under 0.2); the others are refused at once
    with 503, Retry-After and an error."""
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    requests = [tensor_request(seed) for seed in range(40)]
    alone = np.stack([session.run(None, feed)[0].ravel() for _, feed in requests])
    alone /= np.linalg.norm(alone, axis=1, keepdims=True)
    answers = asyncio.run(burst(tensors, [body for body, _ in requests]))
    statuses = [status for status, _, _ in answers]
    assert set(statuses) == {200, 503} and statuses.count(200) >= 3, statuses
    for i, (status, retry, body) in enumerate(answers):
        if status == 503:
            assert retry == b"1" and "overloaded" in orjson.loads(body)["error"]
            continue
        (output,) = orjson.loads(body)["outputs"]
        assert output["shape"] == [1, 16, 384]
        similarity = alone @ np.array(output["data"], np.float32).ravel() / np.linalg.norm(output["data"])
        assert similarity.argmax() == i and similarity[i] > 0.95, (i, similarity[i], similarity.max())


def test_its_texts_are_the_naive_servers_embeddings(texts: str) -> None:
    """Texts of several lengths, each a request, sent at once: each answer is the embedding the naive text server
    computes for that text alone. One text to a length bucket (5, 15 and 20 tokens: buckets 12, 16 and 24), so that
    however they fall into batches each runs alone: the int8 model quantizes a run's activations on one scale, and
    two texts that share a run (5 and 12 tokens, padded to 12 together) differ from alone by 0.017 and 0.030."""
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    tokenizer = tokenizer_from(str(TOKENIZER))
    sentences = ["A cat.", "The quick brown fox jumps over the lazy dog and the cat.", "Serverless inference " * 6]
    assert [len(tokenizer.encode(text).ids) for text in sentences] == [5, 15, 20]

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{texts}/v2/models/minilm-embed/infer",
                        json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]},
                    )
                    for text in sentences
                )
            )

    for text, response in zip(sentences, asyncio.run(send()), strict=True):
        assert response.status_code == 200
        (output,) = response.json()["outputs"]
        assert output["shape"] == [1, 384]
        np.testing.assert_allclose(output["data"][0], embed(tokenizer, session, [text])[0], atol=1e-5)
