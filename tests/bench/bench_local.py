"""The local emulator's own cost: per HTTP request and per SQS batch, with handlers that do nothing.

    make bench        (or: python -m tests.bench.bench_local)

(a) HTTP: sequential POSTs through ``fnserve local``'s gateway to a function that answers a
    fixed response at once (event built, handed to a warm worker, response turned back into
    HTTP), beside the same requests to a bare uvicorn app that answers the same bytes. The
    difference of the medians is the emulator's overhead per request.
(b) SQS: messages fed so that about two batches wait, drained by one poller and one worker
    (BatchSize 10, no window) into a function that only notes the time; the median interval
    between batches is the whole cost of a batch (receive, event, worker round trip,
    delete). moto's own cost of a batch at the same depth (the feeder's SendMessageBatch,
    ReceiveMessage, DeleteMessageBatch), measured in the same run, is subtracted. (Queues
    are kept shallow: moto's ReceiveMessage scans the whole queue, ~0.5 ms per message.)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import boto3
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fnserve.aws import clients
from fnserve.emulator.emulator import Emulator
from tests.bench._timing import percentile
from tests.moto import free_port

REQUESTS = int(os.environ.get("BENCH_LOCAL_REQUESTS", "2000"))
MESSAGES = int(os.environ.get("BENCH_LOCAL_MESSAGES", "1000"))
BODY = b'{"ok": true}'

TEMPLATE = """
Transform: AWS::Serverless-2016-10-31
Globals:
  Function:
    Runtime: python3.12
    Handler: app.handler
    CodeUri: noop
    Timeout: 10
    Environment:
      Variables:
        STAMPS: {stamps}
Resources:
  Jobs:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 60
  Answer:
    Type: AWS::Serverless::Function
    Properties:
      Events:
        Http:
          Type: HttpApi
          Properties:
            Path: /noop
            Method: POST
  Drain:
    Type: AWS::Serverless::Function
    Properties:
      Events:
        Queue:
          Type: SQS
          Properties:
            Queue: !GetAtt Jobs.Arn
            BatchSize: 10
            FunctionResponseTypes: [ReportBatchItemFailures]
"""

APP = """
import os, time

STAMPS = open(os.environ["STAMPS"], "a", buffering=1)


def handler(event, context):
    if "Records" in event:
        STAMPS.write(f"{time.time()} {len(event['Records'])}\\n")
        return {"batchItemFailures": []}
    return {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": '{"ok": true}'}
"""


def sequential_latencies(url: str) -> list[float]:
    with httpx.Client() as client:
        for _ in range(100):
            client.post(url, content=b"{}")
        samples = []
        for _ in range(REQUESTS):
            t0 = time.perf_counter()
            response = client.post(url, content=b"{}")
            samples.append(time.perf_counter() - t0)
            assert response.status_code == 200 and response.content == BODY, response.text
    return samples


def bare_server_latencies() -> list[float]:
    async def answer(request: Request) -> Response:
        await request.body()
        return Response(BODY, media_type="application/json")

    port = free_port()
    app = Starlette(routes=[Route("/noop", answer, methods=["POST"])])
    config = uvicorn.Config(app, port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        return sequential_latencies(f"http://127.0.0.1:{port}/noop")
    finally:
        server.should_exit = True
        thread.join()


def count(stamps: Path) -> int:
    return sum(int(line.split()[1]) for line in stamps.read_text().splitlines())


def drain(endpoint: str, queue_url: str, stamps: Path) -> list[float]:
    """Feed the queue so that about two batches wait at any time; the intervals between batches."""
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    sent = 0
    deadline = time.monotonic() + 300
    while (handled := count(stamps)) < MESSAGES:
        while sent < min(MESSAGES, handled + 20):
            entries = [{"Id": str(i), "MessageBody": f'{{"n": {sent + i}}}'} for i in range(10)]
            sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
            sent += 10
        if time.monotonic() > deadline:
            raise TimeoutError("the emulator did not drain the queue")
        time.sleep(0.002)
    lines = stamps.read_text().splitlines()
    times = [float(line.split()[0]) for line in lines]
    sizes = [int(line.split()[1]) for line in lines]
    print(f"    {len(lines)} batches, {statistics.mean(sizes):.1f} messages each on average")
    return [b - a for a, b in zip(times[5:], times[6:], strict=False)]


def moto_floor(endpoint: str) -> list[float]:
    """What one batch costs in the AWS emulator alone: its SendMessageBatch, ReceiveMessage and
    DeleteMessageBatch, 10 to 20 messages deep."""
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    url = sqs.create_queue(QueueName="bench-floor")["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": f'{{"n": {i}}}'} for i in range(10)]
    sqs.send_message_batch(QueueUrl=url, Entries=entries)
    samples = []
    for _ in range(40):
        t0 = time.perf_counter()
        sqs.send_message_batch(QueueUrl=url, Entries=entries)  # the feeder's call, in the same moto server
        everything = {"AttributeNames": ["All"], "MessageAttributeNames": ["All"]}
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, **everything)["Messages"]
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
        )
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="fnserve-bench-local-"))
    stamps = root / "stamps.txt"
    stamps.touch()
    (root / "template.yaml").write_text(TEMPLATE.format(stamps=stamps))
    (root / "noop").mkdir()
    (root / "noop" / "app.py").write_text(APP)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    port = free_port()
    emulator = Emulator(root / "template.yaml", port=port, workers=1)
    local = emulator.start()
    try:
        bare = bare_server_latencies()
        through = sequential_latencies(f"http://127.0.0.1:{port}/noop")
        bare_p50, p50 = statistics.median(bare) * 1e3, statistics.median(through) * 1e3
        print(f"(a) fnserve local, HTTP API v2 route to a no-op function, {REQUESTS} sequential requests")
        print(f"    bare uvicorn app        p50 {bare_p50:6.3f} ms  p99 {percentile(bare, 99) * 1e3:6.3f} ms")
        print(f"    through the emulator    p50 {p50:6.3f} ms  p99 {percentile(through, 99) * 1e3:6.3f} ms")
        print(f"    -> the emulator's overhead per request: {p50 - bare_p50:.3f} ms (p50)")
        print(f"(b) fnserve local, SQS to a no-op function, {MESSAGES} messages, BatchSize 10, one worker")
        source = next(s for s in emulator.sources if s.function == "Drain")
        gaps = drain(local.endpoint, source.queue_url, stamps)
        floor = statistics.median(moto_floor(local.endpoint)) * 1e3
        gap = statistics.median(gaps) * 1e3
        print(f"    per batch through the emulator  p50 {gap:6.2f} ms  p90 {percentile(gaps, 90) * 1e3:6.2f} ms")
        print(f"    moto's Send + Receive + DeleteMessageBatch alone  p50 {floor:6.2f} ms")
        print(f"    -> the emulator's own overhead per batch: {gap - floor:.2f} ms (p50)")
    finally:
        emulator.stop()
        clients.reset()


if __name__ == "__main__":
    main()
