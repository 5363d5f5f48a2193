"""The local emulator end to end: a real `fnserve local` process, real HTTP, real SQS event flow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import onnxruntime as ort
import openai
import pytest
from huggingface_hub import InferenceClient

from fnserve.aws import clients
from fnserve.core.jobs.messages import job_message
from fnserve.stores import job_client
from tests.e2e.emulator import running_local
from tests.e2e.localstack import localstack
from tests.embeddings import check_client
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO
from tests.moto import free_port, moto_server
from tests.reranking import queries, v2_scores
from tests.servers import wait_for

HOLDOUT = np.load(DEMO_HOLDOUT)
DIGITS = HOLDOUT["input"]


def labels(model: str, x: np.ndarray) -> list[int]:
    session = ort.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
    return session.run(["label"], {"input": x})[0].tolist()  # type: ignore[no-any-return]


# A user's own full LocalStack (e.g. http://localhost:4566, DynamoDB included): the "localstack" runs use it as it is.
LOCALSTACK = os.environ.get("FNSERVE_TEST_LOCALSTACK")


@pytest.fixture(scope="session")
def localstack_aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The endpoints of the "localstack" runs: FNSERVE_TEST_LOCALSTACK's for every service where it names one;
    else LocalStack started here without Docker (tests/e2e/localstack.py: SQS, S3 and Secrets Manager), and
    DynamoDB from a moto server. LocalStack's own DynamoDB is DynamoDB Local, a Java jar under AWS's own terms
    (not an open-source licence) that LocalStack downloads; this project does not download it.

    LocalStack missing (no .venv-localstack: no Python 3.13) fails these runs with the reason; it skips nothing.
    """
    if LOCALSTACK:
        yield {"AWS_ENDPOINT_URL": LOCALSTACK}
        return
    state = tmp_path_factory.mktemp("localstack")
    with localstack(state) as url, moto_server(state / "moto.log") as dynamodb:
        yield {"AWS_ENDPOINT_URL": url, "AWS_ENDPOINT_URL_DYNAMODB": dynamodb}


@pytest.fixture(scope="module", params=["moto", "localstack"])
def local(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A running `fnserve local` on the repository's template: 2 workers a function, no batching
    window, 2 s function timeouts and a 3 s visibility timeout: retries and the DLQ come within seconds.

    Its AWS is the embedded moto server, then LocalStack (``localstack_aws``: DynamoDB from moto unless
    FNSERVE_TEST_LOCALSTACK names a full LocalStack), whose queues are emptied first: a LocalStack of the user's
    keeps what earlier runs left there.
    """
    log = tmp_path_factory.mktemp("local") / "local.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL") and k != "LOCALSTACK_HOST"}
    if request.param == "localstack":
        env |= request.getfixturevalue("localstack_aws")
        env |= {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    options = ["--workers", "2", "--visibility-timeout", "3", "--parameter", "MaximumBatchingWindowInSeconds=0"]
    options += ["--parameter", "FollowupBatchingWindowInSeconds=0", "--parameter", "JobsTimeout=2"]
    with running_local(options, log, env) as info, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", info["endpoint"])
        mp.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
        if "AWS_ENDPOINT_URL_DYNAMODB" in env:
            mp.setenv("AWS_ENDPOINT_URL_DYNAMODB", env["AWS_ENDPOINT_URL_DYNAMODB"])
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(key, env.get(key, "local"))
        mp.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        clients.reset()
        if request.param == "localstack":
            for queue in info["queues"].values():
                drain(queue)
        yield info
    clients.reset()


def drain(queue: str) -> None:
    """Delete what a queue holds. Not PurgeQueue: AWS allows one a minute on a queue and refuses a second within it
    (PurgeQueueInProgress); moto refuses it as AWS does, LocalStack by default does not."""
    sqs = clients.client("sqs")
    while messages := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages"):
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        sqs.delete_message_batch(QueueUrl=queue, Entries=entries)


def infer(url: str, model: str, rows: slice) -> httpx.Response:
    x = DIGITS[rows]
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)


def test_the_openai_client_through_the_gateway(local: dict[str, Any]) -> None:
    """OpenAI's embeddings API in the API function, through the template's /v1 route on the local gateway."""
    with (
        httpx.Client(base_url=local["url"], timeout=60) as http,
        openai.OpenAI(base_url=f"{local['url']}/v1", api_key="unused", timeout=60) as client,
    ):
        check_client(client, http)


def test_http_inference_through_the_gateway(local: dict[str, Any]) -> None:
    response = infer(local["url"], "digits-accurate", slice(0, 8))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == labels("digits-accurate", DIGITS[:8])
    assert "infer;dur=" in response.headers["server-timing"]
    assert httpx.get(f"{local['url']}/v2/models/nope", timeout=10).status_code == 404
    assert httpx.get(f"{local['url']}/elsewhere", timeout=10).json() == {"message": "Not Found"}


def test_the_demo_reranker_puts_the_passage_a_query_came_from_first(local: dict[str, Any]) -> None:
    """make run's minilm-rerank, through the gateway, over V2 and the cohere client: held-out queries, the source
    first."""
    asked = queries()
    with (
        httpx.Client(base_url=local["url"], timeout=60) as http,
        cohere.ClientV2("unused", base_url=local["url"], httpx_client=http) as co,
    ):
        firsts = []
        for query, passages in asked:
            scores = v2_scores(http, query, passages)
            ranked = [r.index for r in co.rerank(model="minilm-rerank", query=query, documents=passages).results]
            assert ranked == np.argsort(-np.array(scores), kind="stable").tolist()  # Cohere's route, V2's order
            firsts.append(ranked[0] == 0)
    assert sum(firsts) >= 0.9 * len(asked), f"{sum(firsts)} of {len(asked)} queries ranked their passage first"


def test_text_embeddings_inference_routes_through_the_gateway(local: dict[str, Any]) -> None:
    """TEI's routes in the API function, through the template's routes on the local gateway: InferenceClient at the
    root (the demo's embedder), the reranker under /tei/, in Cohere's order."""
    text = "A warm container answers at once."
    with httpx.Client(base_url=local["url"], timeout=60) as http:
        vector = InferenceClient(base_url=local["url"]).feature_extraction(text)
        expected = http.post("/v1/embeddings", json={"model": "minilm-embed", "input": text}).json()["data"][0]
        np.testing.assert_allclose(vector[0], expected["embedding"], atol=1e-5)
        query, passages = queries()[0]
        ranked = http.post("/tei/minilm-rerank/rerank", json={"query": query, "texts": passages})
        assert ranked.status_code == 200, ranked.text
        scores = np.array(v2_scores(http, query, passages))
        assert [r["index"] for r in ranked.json()] == np.argsort(-scores, kind="stable").tolist()
        assert http.get("/info").json()["model_id"] == "minilm-embed"
        refused = http.post("/predict", json={"inputs": "a"})
        assert refused.status_code == 424 and refused.json()["error_type"] == "Backend"


def test_the_console_reads_like_sam_local_and_the_raw_lines_go_to_the_log_file(local: dict[str, Any]) -> None:
    assert infer(local["url"], "digits-fast", slice(0, 3)).status_code == 200
    console = local["log"]

    def reported() -> list[str]:
        wanted = "HTTP: POST /v2/models/digits-fast/infer -> 200"
        return [line for line in console.read_text().splitlines() if "REPORT RequestId:" in line and wanted in line]

    wait_for(lambda: bool(reported()), 30, "the invocation's REPORT line")
    request_id = reported()[0].split("REPORT RequestId: ")[1].split()[0]
    lines = [line.split(None, 1)[1] for line in console.read_text().splitlines() if request_id in line]
    assert lines[0] == f"START RequestId: {request_id}  Version: $LATEST"
    assert lines[-2] == f"END RequestId: {request_id}"
    assert "Duration: " in lines[-1] and "Memory Size: " in lines[-1] and "Max Memory Used: " in lines[-1]
    text = console.read_text()
    assert '"_aws"' not in text and "metrics Requests=1" in text  # EMF shown as one readable line
    raw_file = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("  logs "))
    raw = Path(raw_file).read_text()
    assert '"_aws"' in raw and f'"function_request_id":"{request_id}"' in raw


def test_a_cascade_follow_up_flows_through_the_local_queue(local: dict[str, Any]) -> None:
    from tests.helpers.cascade import CORRECTED

    row = int(CORRECTED[0])
    doc = infer(local["url"], "digits", slice(row, row + 1)).json()
    assert doc["parameters"]["followup_status"] == "pending"
    result = httpx.get(f"{local['url']}{doc['parameters']['followup_url']}?wait=20", timeout=30).json()
    assert result["status"] == "done"
    assert result["outputs"][0]["data"] == [int(HOLDOUT["labels"][row])]


def test_good_jobs_are_stored_once_and_poison_ends_in_the_dead_letter_queue(local: dict[str, Any]) -> None:
    queue, dlq = local["queues"]["JobsQueue"], local["queues"]["JobsDeadLetterQueue"]
    table = local["tables"]["ResultsTable"]
    good = [job_message(f"e2e-{i}", "digits-accurate", {"input": DIGITS[i : i + 1]}) for i in range(30)]
    report = job_client.submit(queue, iter(good))
    assert len(report.ids) == 30
    sqs = clients.client("sqs")
    poison = ["{not json", json.dumps({"model": "digits-accurate", "inputs": []})]  # no id: no result to store
    refused = json.dumps({"id": "e2e-bad", "model": "nope", "inputs": []})  # its own fault: stored as failed
    for body in [*poison, refused]:
        sqs.send_message(QueueUrl=queue, MessageBody=body)
    ids = [f"e2e-{i}" for i in range(30)]
    wait_for(lambda: not job_client.fetch_results(table, ids).pending, 60, "every good job's result")
    found = job_client.fetch_results(table, ids)
    got = [found.done[f"e2e-{i}"]["label"][0] for i in range(30)]
    assert got == labels("digits-accurate", DIGITS[:30])

    def in_dlq() -> int:
        attributes = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        return int(attributes["Attributes"]["ApproximateNumberOfMessages"])

    # 5 receives, 3 s visibility each: the poison messages move to the DLQ, as on AWS. A received message is back in
    # sight when its visibility timeout ends on AWS and moto; on LocalStack up to a second later (its timer ticks
    # once a second), so its 5 receives take up to 5 s more. The bound covers both.
    wait_for(lambda: in_dlq() == len(poison), 60, "the poison messages in the DLQ")
    remaining = sqs.get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )
    assert all(v == "0" for v in remaining["Attributes"].values())
    assert sorted(job_client.fetch_results(table, ids).done) == sorted(ids)
    assert "'inputs' must be a non-empty list" in job_client.fetch_results(table, ["e2e-bad"]).failed["e2e-bad"]


def test_a_worker_killed_mid_load_fails_no_request_silently_and_comes_back(local: dict[str, Any]) -> None:
    statuses: list[int] = []

    def load() -> None:
        for _ in range(15):
            try:
                statuses.append(infer(local["url"], "digits-fast", slice(0, 2)).status_code)
            except httpx.TimeoutException:
                statuses.append(-1)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(statuses) >= 5, 60, "the load to be under way")
    victim = local["functions"]["ApiFunction"][0]
    os.kill(victim, signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=120)
    assert len(statuses) == 60 and -1 not in statuses  # every request answered, none hung
    assert set(statuses) <= {200, 500}  # the one that died: a function error (Runtime.ExitError on AWS), HTTP API 500

    def replaced() -> bool:
        pids = httpx.get(f"{local['url']}/_fnserve/local", timeout=10).json()["functions"]["ApiFunction"]
        return victim not in pids and len(pids) == 2

    wait_for(replaced, 60, "the worker to be replaced")
    for _ in range(6):
        assert infer(local["url"], "digits-fast", slice(0, 2)).status_code == 200


def test_the_lines_fnserve_local_prints_work_verbatim_in_a_shell_without_aws_configuration(
    local: dict[str, Any], tmp_path: Path
) -> None:
    # The gateway answers before the banner is out: it is printed once the lines to try are worked out.
    wait_for(lambda: "Ctrl-C stops it." in local["log"].read_text(), 60, "the banner")
    banner = local["log"].read_text().splitlines()
    tries = [line.removeprefix("  try ").strip() for line in banner if line.startswith("  try ")]
    submit = next(line.removeprefix("  jobs ").strip() for line in banner if line.startswith("  jobs "))
    results = next(line.strip() for line in banner if line.startswith("        AWS_ENDPOINT_URL"))
    curl, text_curl, rerank_curl = tries  # the cascade, then the pipelines that take text: an embedder, a reranker
    for name in ("layers", ".venv"):  # a directory that looks like the repository: the lines' relative paths hold
        (tmp_path / name).symlink_to(REPO / name)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no AWS_* variables, no ~/.aws

    def shell(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    answer = shell(curl)
    assert answer.returncode == 0 and json.loads(answer.stdout)["model_name"] == "digits"
    embedded = shell(text_curl)
    assert embedded.returncode == 0 and json.loads(embedded.stdout)["outputs"][0]["shape"] == [1, 384]
    ranked = shell(rerank_curl)
    assert ranked.returncode == 0 and json.loads(ranked.stdout)["outputs"][0]["name"] == "score", ranked.stdout
    sent = shell(submit)
    assert sent.returncode == 0, sent.stderr
    assert "submitted 360 jobs" in sent.stderr and "Traceback" not in sent.stderr
    assert len((tmp_path / "ids.txt").read_text().split()) == 360

    def all_done() -> bool:
        fetched = shell(results)
        assert fetched.returncode == 0, fetched.stderr
        return "done 360, failed 0, pending 0" in fetched.stdout

    wait_for(all_done, 120, "every job of the printed submit line")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["outputs"]["label"][0] for row in rows] == labels("digits-accurate", DIGITS[:360])


def test_cli_errors_are_one_line_saying_what_to_do(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    (tmp_path / "ids.txt").write_text("job-1\n")
    cmd = [sys.executable, "-m", "fnserve", "results", "ids.txt", "--table", "t", "-o", "out.jsonl"]
    plain = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines() == [
        "error: reading results from DynamoDB table 't': no AWS region is configured; set AWS_DEFAULT_REGION"
    ]
    unreachable = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    down = subprocess.run(cmd, cwd=tmp_path, env=unreachable, capture_output=True, text=True, timeout=60)
    assert down.stderr.strip().splitlines() == [
        "error: reading results from DynamoDB table 't': it cannot be reached, try again later"
    ]
    debug = [sys.executable, "-m", "fnserve", "--debug", *cmd[3:]]
    traced = subprocess.run(debug, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert traced.returncode == 1 and "Traceback" in traced.stderr and "NoRegionError" in traced.stderr
