"""Admission by time, fnserve's default: clients that wait for their answers are served however many they are, while
an overload is refused at once, before its body is read."""

from __future__ import annotations

import asyncio
import json
import math
import os
import tomllib
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from fnserve.adapters.http.app import create_app
from fnserve.core.batching.scheduler import BatchObservers
from fnserve.core.execution.service import InferenceService
from fnserve.core.serving.dataplane import DataPlane
from fnserve.settings import Settings
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, body_never_comes, manifest_of, post_scope
from tests.servers import start_server


def tokens(rows: int) -> dict[str, object]:
    """A V2 request of MiniLM's three INT64 inputs, ``rows`` texts of 16 tokens."""
    ids = np.full((rows, 16), 1000, np.int64)
    names = ("input_ids", "attention_mask", "token_type_ids")
    return {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel()}
            for n, a in zip(names, (ids, np.ones_like(ids), np.zeros_like(ids)), strict=True)
        ]
    }


def digits(rows: int) -> dict[str, object]:
    x = np.load(DEMO_HOLDOUT)["input"][:rows]
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel()}]}


def wire(port: int, model: str, body: dict[str, object]) -> bytes:
    data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def closed_loop(requests: list[bytes], port: int, calls: int) -> dict[int, int]:
    """A client for each of ``requests``, on its own connection, sending it and reading the answer before sending
    it again, ``calls`` times: how many answers came back with each status."""
    statuses: dict[int, int] = {}

    async def client(request: bytes) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(calls):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = next(int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:")
            await reader.readexactly(length)
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()
        await writer.wait_closed()

    await asyncio.gather(*(client(request) for request in requests))
    return statuses


# A queue deadline no starved CPU reaches: in a closed loop only a bound on rows could refuse a request, and the
# test must not turn on how fast the machine runs the batches (on a busy one a time bound rightly sheds some).
PATIENT = 60_000


def digits_manifest(directory: Path) -> Path:
    """The demo's digits-accurate, batching 16 rows."""
    demo = next(m for m in tomllib.loads(DEMO_MANIFEST.read_text())["models"] if m["name"] == "digits-accurate")
    path = directory / "manifest.toml"
    path.write_text(
        f'''[[models]]
name = "digits-accurate"
path = "{DEMO_MANIFEST.parent / demo["path"]}"
sha256 = "{demo["sha256"]}"
max_batch_size = 16
max_batch_time_ms = 2
max_queue_delay_ms = {PATIENT}
'''
    )
    return path


def minilm_manifest(directory: Path) -> Path:
    """The demo's minilm-l6 as it ships (its batch and token budgets), with the patient queue deadline."""
    path = directory / "manifest.toml"
    path.write_text(manifest_of("minilm-l6", str(DEMO_MANIFEST.parent)) + f"max_queue_delay_ms = {PATIENT}\n")
    return path


@pytest.mark.parametrize(
    ("model", "batch", "clients", "calls"),
    [
        ("minilm-l6", 64, 192, 8),  # the demo's, one text of 16 tokens a request: 64 rows, its 1,024-token budget
        ("digits-accurate", 16, 64, 50),  # one client in eight sends 4 rows
    ],
)
def test_a_closed_loop_of_several_batches_of_clients_is_never_refused(
    tmp_path: Path, model: str, batch: int, clients: int, calls: int
) -> None:
    """Clients that each wait for their answer before sending again, several times as many as a batch's rows, on one
    front process: its batches run full, more than a batch waits behind the one running, and every request is
    answered. A bound on the rows waiting near one batch refused some whenever the batch running was not full."""
    manifest = minilm_manifest(tmp_path) if model == "minilm-l6" else digits_manifest(tmp_path)
    env = {**os.environ, "FNSERVE_ACCESS_LOG": "false"}
    options = ["-m", str(manifest), "--processes", "1", "--workers", "0"]
    proc, url = start_server(options, tmp_path / "serve.log", env=env)
    try:
        port = int(url.rsplit(":", 1)[1])
        if model == "minilm-l6":
            requests = [wire(port, model, tokens(1))] * clients
        else:
            requests = [wire(port, model, digits(4 if i % 8 == 7 else 1)) for i in range(clients)]
        statuses = asyncio.run(closed_loop(requests, port, calls))
        stats = httpx.get(f"{url}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert statuses == {200: clients * calls}, (statuses, (tmp_path / "serve.log").read_text()[-2000:])
    sizes = {entry["batch_size"] for entry in stats["batch_stats"]}
    assert max(sizes) == batch, sizes  # at capacity: full batches, while more waited for the next


def test_an_overload_is_refused_by_its_foreseen_wait_before_its_body_is_read(tmp_path: Path) -> None:
    """The demo's minilm-l6 with its default bounds, flooded with more full batches at once than it runs in its queue
    deadline (max_queue_delay_ms unset: a second): those foreseen to wait longer, at the pace of its latest runs, are
    refused as they arrive (503), the others answered; while the queue holds that much, a request is refused from
    its headers alone, its body never read."""
    service = InferenceService.from_manifest(DEMO_MANIFEST, eager=True)
    reasons: list[str] = []
    plane = DataPlane(service, batching=True, observers=lambda model: BatchObservers(on_shed=reasons.append))
    app = create_app(plane, Settings(manifest=DEMO_MANIFEST, access_log=False))
    batcher = plane.batchers["minilm-l6"]
    # The defaults: a bound on time, not rows.
    assert (batcher.policy.max_queue, batcher.policy.max_queue_delay) == (None, None)
    url = "/v2/models/minilm-l6/infer"
    scope = post_scope(url, [(b"content-type", b"application/json"), (b"content-length", b"100000")])
    embeddings = post_scope("/v1/embeddings", [(b"content-type", b"application/json"), (b"content-length", b"100")])
    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    def past_deadline() -> bool:
        return batcher.admission.foreseen_wait(batcher.queued(), 1) > batcher.admission.queue_delay()

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=120) as client:
            full = orjson.dumps(tokens(64), option=orjson.OPT_SERIALIZE_NUMPY)
            headers = {"content-type": "application/json"}
            first = await client.post(url, content=full, headers=headers)  # its run sets the pace
            assert first.status_code == 200, first.text
            # Three times the batches it runs in its queue deadline (a second, or two batches if longer), at once.
            delay = batcher.admission.queue_delay()
            assert delay == max(1.0, 2 * batcher.admission.pace.seconds(64))
            flood = 3 * math.ceil(delay / batcher.admission.pace.seconds(64)) + 3
            # The model's slot held while the flood comes, so that its queue cannot drain under the probe below:
            # the refusal is then the queue's doing, not a race with the batches' runs.
            slots = batcher._slots
            assert slots is not None
            await slots.acquire()
            tasks = [asyncio.create_task(client.post(url, content=full, headers=headers)) for _ in range(flood)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not past_deadline():
                assert loop.time() < deadline and not all(t.done() for t in tasks), "the queue never filled"
                await asyncio.sleep(0.001)
            try:
                await asyncio.wait_for(app(scope, body_never_comes, send), 30)
                # OpenAI's route to the pipeline over the same model, refused alike, in OpenAI's error shape.
                await asyncio.wait_for(app(embeddings, body_never_comes, send), 30)
            finally:
                slots.release()
            return [r.status_code for r in await asyncio.gather(*tasks)]

    statuses = asyncio.run(main())
    assert set(statuses) == {200, 503}, statuses  # the excess refused, the rest answered
    start, body, openai_start, openai_body = sent
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]  # type: ignore[operator]
    error = json.loads(body["body"])["error"]  # type: ignore[arg-type]
    assert "would keep it waiting about" in error and "past its queue deadline of" in error, error
    assert openai_start["status"] == 503 and (b"retry-after", b"1") in openai_start["headers"]  # type: ignore[operator]
    refusal = json.loads(openai_body["body"])["error"]  # type: ignore[arg-type]
    assert refusal["type"] == "server_error" and refusal["code"] == "overloaded", refusal
    assert "would keep it waiting about" in refusal["message"], refusal
    assert "queue_wait" in reasons and "queue_full" not in reasons
