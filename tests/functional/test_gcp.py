"""The Google Cloud functions on the real functions-framework server (its ASGI mode): the HTTP function
driven by tritonclient, the Pub/Sub job function by Pub/Sub-shaped CloudEvents, results in a real
redis-server, inputs and models in Cloud Storage (gcp-storage-emulator), messages published by the
real Pub/Sub client (see :mod:`tests.pubsub` for what stands in for Pub/Sub itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import hashlib
import json
import os
import subprocess
import sys
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import redis
import tritonclient.http as triton
from packaging.requirements import Requirement
from tritonclient.utils import InferenceServerException

import fnserve
from fnserve import bootstrap
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.messages import job_message
from fnserve.settings import Settings
from fnserve.stores import gcs as gcs_storage
from fnserve.stores import job_client, pubsub
from tests.embeddings import SENTENCES, check_client
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO
from tests.helpers.cascade import CORRECTED, LABELS, SLOW_LABEL
from tests.helpers.clouds import Gcs
from tests.helpers.functions import FUNCTIONS_FRAMEWORK
from tests.moto import free_port
from tests.pubsub import Message, Topics, cloud_event, deliver
from tests.servers import start_http

DIGITS = np.load(DEMO_HOLDOUT)["input"]
PROJECT = "fnserve-test"
JOBS_TOPIC = f"projects/{PROJECT}/topics/jobs"
FOLLOWUP_TOPIC = f"projects/{PROJECT}/topics/followups"
MAX_ATTEMPTS = 3  # the subscriptions' dead-letter policy, and FNSERVE_MAX_RECEIVE_COUNT
LOGS: dict[str, Path] = {}  # each function's output, by its URL


@pytest.fixture(scope="module")
def results_url(redis_url: str) -> str:
    """A Redis database of this module's own (the Redis store tests flush database 0)."""
    url = redis_url.rpartition("/")[0] + "/1"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture(scope="module")
def topics() -> Iterator[Topics]:
    topics = Topics(JOBS_TOPIC, FOLLOWUP_TOPIC)
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = topics.host  # this process's publisher too
    pubsub.publisher.cache_clear()
    yield topics
    pubsub.publisher.cache_clear()
    os.environ.pop("PUBSUB_EMULATOR_HOST") if previous is None else os.environ.update(PUBSUB_EMULATOR_HOST=previous)
    topics.stop()


@pytest.fixture(scope="module")
def env(results_url: str, gcs: Gcs, topics: Topics) -> dict[str, str]:
    """What the deploy script sets (infra/gcp/deploy.sh), pointed at the local servers."""
    return {
        **os.environ,
        "FNSERVE_MANIFEST": str(DEMO_MANIFEST),
        "FNSERVE_RESULTS": results_url,
        "FNSERVE_RESULTS_BUCKET": gcs.bucket,
        "FNSERVE_FOLLOWUP_TOPIC": FOLLOWUP_TOPIC,
        "FNSERVE_MAX_RECEIVE_COUNT": str(MAX_ATTEMPTS),
        "FNSERVE_RESULT_ID_KEY": "gcp-test-key",
        # The test's client sends a few hundred events a second: gather long enough to see batches.
        "FNSERVE_JOBS_GATHER_MS": "50",
        "GOOGLE_CLOUD_PROJECT": PROJECT,
        "STORAGE_EMULATOR_HOST": gcs.url,
        "PUBSUB_EMULATOR_HOST": topics.host,
        # Inputs by reference to S3 fail as an outage would: nothing listens there.
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{free_port()}",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@contextlib.contextmanager
def start_function(target: str, signature: str, env: dict[str, str], directory: Path) -> Iterator[str]:
    port = free_port()
    log = directory / f"{target}.log"
    source = REPO / "functions" / ("gcp_api" if signature == "http" else "gcp_jobs") / "main.py"
    command = [FUNCTIONS_FRAMEWORK, "--target", target, "--source", str(source), "--signature-type", signature]
    command += ["--asgi", "--port", str(port), "--host", "127.0.0.1"]
    if signature == "http":
        proc, url = start_http(command, port, log, env=env)
    else:  # a CloudEvent function answers POST only: up once GET says so
        proc, url = start_http(command, port, log, env=env, ready_path="/", ready_status=405)
    LOGS[url] = log
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture(scope="module")
def function(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``functions-framework --asgi`` serving functions/gcp_api/main.py on the demo manifest (its pipelines too)."""
    with start_function("infer", "http", env, tmp_path_factory.mktemp("gcp-api")) as url:
        yield url


@pytest.fixture(scope="module")
def jobs_function(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``functions-framework --signature-type cloudevent`` serving functions/gcp_jobs/main.py."""
    with start_function("jobs", "cloudevent", env, tmp_path_factory.mktemp("gcp-jobs")) as url:
        yield url


@pytest.fixture(scope="module")
def service() -> InferenceService:
    return InferenceService.from_manifest(DEMO_MANIFEST)


def log_lines(url: str) -> list[dict[str, Any]]:
    """The function's JSON log lines (fnserve's; the framework's own are plain text)."""
    lines = []
    for line in LOGS[url].read_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def test_tritonclient_infers_through_the_function_in_json_and_binary(function: str, service: InferenceService) -> None:
    client = triton.InferenceServerClient(function.removeprefix("http://"))
    assert client.is_server_ready() and client.is_model_ready("digits-accurate")
    assert client.get_model_metadata("digits-accurate")["inputs"][0]["shape"] == [-1, 64]
    expected = service.predict("digits-accurate", {"input": DIGITS[:5]})
    for binary in (False, True):
        tensor = triton.InferInput("input", [5, 64], "FP32")
        tensor.set_data_from_numpy(DIGITS[:5], binary_data=binary)
        outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("label", "probabilities")]
        result = client.infer("digits-accurate", [tensor], outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-6)
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"A warm container answers at once."], dtype=object))
    assert client.infer("minilm-embed", [text]).as_numpy("embedding").shape == (1, 384)
    client.close()


def test_the_openai_client_against_the_function(function: str) -> None:
    with (
        httpx.Client(base_url=function, timeout=60) as http,
        openai.OpenAI(base_url=f"{function}/v1", api_key="unused", timeout=60) as client,
    ):
        check_client(client, http)

    async def embed() -> int:
        async with openai.AsyncOpenAI(base_url=f"{function}/v1", api_key="unused", timeout=60) as client:
            calls = [client.embeddings.create(model="minilm-embed", input=text) for text in SENTENCES[:8]]
            answers = await asyncio.gather(*calls)
        return sum(len(a.data) for a in answers)

    assert asyncio.run(embed()) == 8


def test_bad_input_is_a_422_with_what_is_wrong(function: str) -> None:
    client = triton.InferenceServerClient(function.removeprefix("http://"))
    tensor = triton.InferInput("input", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="must have 64 at axis 1") as raised:
        client.infer("digits-accurate", [tensor])
    assert raised.value.status() == "422"
    client.close()
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
    response = httpx.post(f"{function}/v2/models/nope/infer", json=body)
    assert response.status_code == 404 and response.json() == {
        "error": "Request for unknown model: 'nope' is not found"
    }
    assert httpx.post(f"{function}/v2/models/digits-accurate/infer", content=b"{oops").status_code == 400


def test_models_load_once_per_instance(function: str) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
    for _ in range(3):
        assert httpx.post(f"{function}/v2/models/digits-fast/infer", json=body).status_code == 200
    log = LOGS[function].read_text()
    assert log.count("loaded model 'digits-fast'") == 1  # warm globals: once, not per request


def test_log_lines_are_cloud_logging_json_carrying_the_request_trace(function: str) -> None:
    trace = uuid.uuid4().hex
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
    headers = {"x-cloud-trace-context": f"{trace}/12345;o=1"}
    response = httpx.post(f"{function}/v2/models/digits-fast/infer", json=body, headers=headers)
    assert response.status_code == 200 and response.headers["x-request-id"] == trace  # the trace names the request
    parent = f"00-{uuid.uuid4().hex}-{'ab' * 8}-00"
    assert httpx.post(f"{function}/v2/models/digits-fast/infer", json=body, headers={"traceparent": parent}).is_success
    lines = log_lines(function)
    mine = [line for line in lines if line.get("request_id") == trace]
    assert mine, lines[-3:]
    line = mine[-1]
    assert line["severity"] == "INFO" and line["message"] == "inference" and line["time"].endswith("Z")
    assert line["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{trace}"
    assert line["logging.googleapis.com/spanId"] == f"{12345:016x}" and line["logging.googleapis.com/trace_sampled"]
    w3c = [line for line in lines if line.get("logging.googleapis.com/spanId") == "ab" * 8]
    assert w3c and w3c[-1]["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{parent[3:35]}"
    assert w3c[-1]["logging.googleapis.com/trace_sampled"] is False
    assert all("level" not in line for line in lines)  # every line of fnserve's in Cloud Logging's shape


def poison_jobs() -> list[bytes]:
    """Jobs at fault, each its own way; the last ones have no id to store a reason under."""
    wrong_shape = job_message("poison-shape", "digits-accurate", {"input": DIGITS[:1, :3]})
    unknown_model = job_message("poison-model", "no-such-model", {"input": DIGITS[:1]})
    no_inputs = {"id": "poison-empty", "model": "digits-accurate", "inputs": []}
    missing_object = {"id": "poison-gone", "model": "digits-accurate", "payload": {"uri": "gs://payloads/gone.json"}}
    with_ids = [orjson.dumps(job) for job in (wrong_shape, unknown_model, no_inputs, missing_object)]
    return with_ids + [b"{not json", b'{"model": "digits-accurate"}']


def redis_calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in client.info("commandstats").items()}


def test_500_jobs_with_poison_good_ones_stored_once_poison_failed_and_nothing_lost(
    jobs_function: str, topics: Topics, results_url: str, service: InferenceService
) -> None:
    rows = [DIGITS[i % 300 : i % 300 + 1 + i % 3] for i in range(494)]
    good = [job_message(f"good-{i:03d}", "digits-accurate", {"input": x}) for i, x in enumerate(rows)]
    report = job_client.publish(JOBS_TOPIC, iter(good))
    assert len(report.ids) == 494 and not report.failed and topics.calls < 494  # batched publishes
    for body in poison_jobs():
        pubsub.publisher(0.05).publish(JOBS_TOPIC, body).result()
    messages = topics.take(JOBS_TOPIC)
    assert len(messages) == 500
    client = redis.Redis.from_url(results_url)
    client.config_resetstat()
    delivery = deliver(jobs_function, messages, max_attempts=MAX_ATTEMPTS)
    # Every job with an id is acknowledged at once; the two without one go to the dead-letter topic.
    # (A push that got no answer, a reset under load, is redelivered as Pub/Sub does: see tests/pubsub.py.)
    by_body = {m.data: delivery.answers(m.id) for m in messages}
    assert all(answers == [200] for body, answers in by_body.items() if b'"id"' in body), by_body
    assert sorted(m.data for m in delivery.dead_lettered) == sorted(poison_jobs()[-2:])
    assert by_body[b"{not json"] and set(by_body[b"{not json"]) == {503}
    assert all(len(delivery.statuses[m.id]) == MAX_ATTEMPTS for m in delivery.dead_lettered)
    writes = redis_calls(client).get("set", 0)
    # One SET per job with an id: 494 done, 4 failed (a failed job pushed again after a lost answer: once more).
    assert 498 <= writes <= 498 + delivery.lost, (writes, delivery.lost)
    found = job_client.fetch_results(results_url, report.ids)
    assert not found.failed and not found.pending and len(found.done) == 494
    for x, job in zip(rows, good, strict=True):
        expected = service.predict("digits-accurate", {"input": x})
        np.testing.assert_array_equal(found.done[job["id"]]["label"], expected["label"])
    poison = job_client.fetch_results(results_url, ["poison-shape", "poison-model", "poison-empty", "poison-gone"])
    assert "must have 64 at axis 1" in poison.failed["poison-shape"]
    assert poison.failed["poison-model"] == "Request for unknown model: 'no-such-model' is not found"
    assert "'inputs' must be a non-empty list" in poison.failed["poison-empty"]
    assert "gs://payloads/gone.json cannot be read: it does not exist" in poison.failed["poison-gone"]
    # Gathered: the instance ran the concurrent events as batches, not one by one. How many pushes a batch gathers
    # follows how fast this process pushes beside the other worker's tests, so the bound is a share of the pushes.
    batches = [line["records"] for line in log_lines(jobs_function) if line.get("message") == "batch"]
    pushes = sum(len(statuses) for statuses in delivery.statuses.values())  # 500 + 2 × (MAX_ATTEMPTS - 1) if none lost
    assert pushes - delivery.lost <= sum(batches) <= pushes and len(batches) <= pushes // 3, (batches, delivery.lost)
    # Pub/Sub delivers again (an ack lost, a slow instance): nothing is computed or written twice.
    again = [m for m in messages if b'"id"' in m.data]
    # A push that gets no answer (a connection reset under load) is pushed again, as Pub/Sub would: every message
    # is then answered once, and with 200.
    redelivered = deliver(jobs_function, again, max_attempts=3, attempt=2)
    assert all(redelivered.answers(m.id) == [200] for m in again)
    rewrites = redis_calls(client).get("set", 0) - writes
    assert 4 <= rewrites <= 4 + redelivered.lost  # only the failed ones are run (and refused) again
    assert job_client.fetch_results(results_url, report.ids).done.keys() == found.done.keys()


def test_a_fault_that_may_heal_is_redelivered_then_stored_failed_and_dead_lettered(
    jobs_function: str, topics: Topics, results_url: str
) -> None:
    outage = {"id": "s3-outage", "model": "digits-accurate", "payload": {"uri": "s3://inputs/job.json"}}
    pubsub.publisher(0.05).publish(JOBS_TOPIC, orjson.dumps(outage)).result()
    [message] = topics.take(JOBS_TOPIC)
    delivery = deliver(jobs_function, [message], max_attempts=MAX_ATTEMPTS)
    # As on SQS: the last delivery stores the reason and still fails, so the message reaches the dead-letter topic.
    assert set(delivery.answers(message.id)) == {503} and delivery.dead_lettered == [message]
    assert len(delivery.statuses[message.id]) == MAX_ATTEMPTS
    failed = job_client.fetch_results(results_url, ["s3-outage"]).failed["s3-outage"]
    assert "s3://inputs/job.json cannot be read" in failed


def test_inputs_by_reference_to_cloud_storage(jobs_function: str, topics: Topics, results_url: str) -> None:
    rows = DIGITS[:300]
    job = job_message("by-gcs", "digits-accurate", {"input": rows})
    big = {**job, "padding": "x" * (pubsub.MAX_MESSAGE_BYTES + 1)}  # over Pub/Sub's limit: sent by reference
    report = job_client.publish(JOBS_TOPIC, iter([big]), bucket="gs://payloads")
    assert report.by_reference == 1 and report.ids == ["by-gcs"]
    [message] = topics.take(JOBS_TOPIC)
    assert orjson.loads(message.data)["payload"]["uri"] == "gs://payloads/fnserve/jobs/by-gcs.json"
    assert deliver(jobs_function, [message]).answers(message.id) == [200]
    assert job_client.fetch_results(results_url, ["by-gcs"]).done["by-gcs"]["label"].shape == (300,)


def test_events_that_are_not_pubsub_messages(jobs_function: str) -> None:
    headers, _ = cloud_event(Message(JOBS_TOPIC, "not-pubsub", b"{}", {}), 1, "projects/p/subscriptions/s")
    not_pubsub = httpx.post(jobs_function, headers=headers, content=b'{"hello": "world"}')
    assert not_pubsub.status_code == 503  # no job to store a reason under: to the dead-letter topic
    assert httpx.post(jobs_function, content=b"not a cloud event").status_code == 400


def test_a_cascade_follows_up_over_its_own_topic(
    function: str, jobs_function: str, topics: Topics, service: InferenceService
) -> None:
    rows = CORRECTED[:3]
    answers = []
    for i in rows:
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[i].tolist()}]}
        answers.append(httpx.post(f"{function}/v2/models/digits/infer", json=body).json())
    assert all(a["parameters"]["followup_status"] == "pending" for a in answers), answers
    followups = topics.take(FOLLOWUP_TOPIC)
    assert len(followups) == 3
    delivery = deliver(jobs_function, followups)
    assert all(delivery.answers(m.id) == [200] for m in followups)
    for i, answer in zip(rows, answers, strict=True):
        result = httpx.get(f"{function}{answer['parameters']['followup_url']}").json()
        assert result["status"] == "done" and result["model_name"] == "digits-accurate", result
        label = {o["name"]: o for o in result["outputs"]}["label"]["data"]
        assert label == [int(SLOW_LABEL[i])] == [int(LABELS[i])]


def test_submit_and_results_from_the_command_line(
    jobs_function: str, topics: Topics, results_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    fnserve = str(Path(sys.executable).parent / "fnserve")
    ids = tmp_path / "ids.txt"
    submitted = subprocess.run(
        [fnserve, "submit", str(DEMO_HOLDOUT), "--model", "digits-accurate", "--topic", JOBS_TOPIC]
        + ["--rows-per-job", "20", "--ids", str(ids)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr
    count = len(ids.read_text().split())
    assert count == -(-len(DIGITS) // 20) and f"submitted {count} jobs" in submitted.stderr
    messages = topics.take(JOBS_TOPIC)
    delivery = deliver(jobs_function, messages)
    assert messages and all(delivery.answers(m.id) == [200] for m in messages)
    out = tmp_path / "out.npz"
    fetched = subprocess.run(
        [fnserve, "results", str(ids), "--results", results_url, "-o", str(out)],
        env={k: v for k, v in env.items() if k != "FNSERVE_RESULTS_TABLE"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fetched.returncode == 0 and f"done {count}, failed 0, pending 0" in fetched.stdout, fetched.stderr
    assert np.load(out)["label"].shape == (len(DIGITS),)
    wrong = subprocess.run(
        [fnserve, "submit", str(DEMO_HOLDOUT), "--model", "digits-accurate", "--topic", "jobs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrong.returncode == 1 and "is not a Pub/Sub topic: projects/PROJECT/topics/TOPIC" in wrong.stderr


def test_models_and_the_manifest_from_cloud_storage(gcs: Gcs, tmp_path: Path, service: InferenceService) -> None:
    model = (DEMO_MANIFEST.parent / "digits-fast" / "1" / "model.onnx").read_bytes()
    bucket = gcs_storage.client().create_bucket(f"models-{uuid.uuid4().hex[:8]}")
    bucket.blob("demo/digits-fast/1/model.onnx").upload_from_string(model)
    manifest = '[[models]]\nname = "digits-fast"\npath = "digits-fast/1/model.onnx"\n'
    manifest += f'sha256 = "{hashlib.sha256(model).hexdigest()}"\n'
    bucket.blob("demo/manifest.toml").upload_from_string(manifest)
    settings = Settings(manifest=f"gs://{bucket.name}/demo/manifest.toml", model_cache_dir=tmp_path)
    fetched = bootstrap.build_service(settings)
    got = fetched.predict("digits-fast", {"input": DIGITS[:8]})
    np.testing.assert_array_equal(got["label"], service.predict("digits-fast", {"input": DIGITS[:8]})["label"])
    broken = Settings(manifest=f"gs://{bucket.name}/demo/missing.toml", model_cache_dir=tmp_path)
    with pytest.raises(Exception, match="missing.toml cannot be read: it does not exist"):
        bootstrap.build_service(broken)


def test_concurrent_events_run_as_one_batch_and_one_runtime_call() -> None:
    from fnserve.adapters.gcp.jobs import Gatherer
    from fnserve.core.jobs.processor import JobProcessor
    from tests.helpers import MemoryStore

    class Counting(JobProcessor):
        batches: list[int] = []

        def process(self, records):  # type: ignore[no-untyped-def]
            self.batches.append(len(records))
            return super().process(records)

    service = InferenceService.from_manifest(DEMO_MANIFEST)  # its own: its session is watched
    runtime_calls = []
    session = service.registry.get("digits-accurate").session
    real_run = session.run
    session.run = lambda *a, **k: runtime_calls.append(1) or real_run(*a, **k)  # type: ignore[method-assign]
    processor = Counting(service, MemoryStore(), ttl_seconds=60, max_receive_count=MAX_ATTEMPTS)
    gatherer = Gatherer(processor, window=0.05, max_jobs=40)
    jobs = [orjson.dumps(job_message(f"g-{i}", "digits-accurate", {"input": DIGITS[i : i + 1]})) for i in range(100)]

    async def events() -> list[bool]:
        return await asyncio.gather(*(gatherer.redeliver((f"m{i}", body, 1)) for i, body in enumerate(jobs)))

    assert asyncio.run(events()) == [False] * 100  # every one acknowledged
    assert Counting.batches == [40, 40, 20]  # full batches at once, the rest after the window
    assert len(runtime_calls) == 3  # each batch's same-shaped jobs stacked: one runtime call
    assert sorted(processor.store.records) == sorted(f"job#g-{i}" for i in range(100))


def _spec(requirement: Requirement) -> tuple[str, str, list[str]]:
    """What a requirement asks for, however it is spelled (its marker aside: the wheel adds the extra's)."""
    return requirement.name, str(requirement.specifier), sorted(requirement.extras)


def test_the_deploy_script_stages_sources_that_serve_and_deploys_least_privilege(tmp_path: Path) -> None:
    build = tmp_path / "build"
    command = ["bash", str(REPO / "infra" / "gcp" / "deploy.sh"), "--project", PROJECT, "--redis"]
    command += ["redis://10.0.0.3:6379/0", "--bucket", "gs://payloads", "--vpc-connector", "fnserve", "--dry-run"]
    env = {**os.environ, "BUILD": str(build), "PYTHON": sys.executable}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    commands = done.stdout.splitlines()
    deploys = [line for line in commands if line.startswith("gcloud functions deploy")]
    assert [line.split()[3] for line in deploys] == ["fnserve-api", "fnserve-jobs", "fnserve-followups"]
    assert all("--retry" in line and "--trigger-topic" in line for line in deploys[1:])
    assert all("--vpc-connector fnserve" in line and "FNSERVE_RESULT_ID_KEY=" in line for line in deploys)
    # Each function's timeout is what its work is foreseen against.
    assert "--timeout 60" in deploys[0] and "FNSERVE_REQUEST_TIMEOUT_SECONDS=60" in deploys[0]
    assert all("--timeout 540" in d and "FNSERVE_REQUEST_TIMEOUT_SECONDS=540" in d for d in deploys[1:])
    assert any(
        "subscriptions update SUBSCRIPTION-OF-fnserve-jobs --dead-letter-topic fnserve-dead-letter" in line
        and "--max-delivery-attempts 5" in line
        for line in commands
    )
    roles = [line.split("--role ")[1] for line in commands if "--role" in line]
    assert "roles/editor" not in roles and "roles/owner" not in roles
    refused = subprocess.run(command[:4] + ["--dry-run"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--redis is required" in refused.stderr
    # The staged source is what Cloud Functions builds: its requirements installed in a fresh virtualenv (fnserve
    # from the staged wheel, with the gcp extra's dependencies), it serves on functions-framework from there.
    api = build / "api"
    wheel = next(api.glob("fnserve-*-py3-none-any.whl"))
    assert sorted(p.name for p in api.iterdir()) == sorted([wheel.name, "main.py", "models", "requirements.txt"])
    # The locked versions, then the wheel: what deploys is what the tests ran (infra/gcp/requirements.lock).
    lock = (REPO / "infra" / "gcp" / "requirements.lock").read_text()
    assert (api / "requirements.txt").read_text() == f"{lock}./{wheel.name}[gcp]\n"
    # The wheel is this checkout's: its version, pyproject's gcp extra, its modules and no others (a module deleted
    # from the source but left in an earlier build's build/lib would otherwise ship).
    assert wheel.name == f"fnserve-{fnserve.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        modules = {name for name in whl.namelist() if name.endswith(".py")}
        metadata = email.parser.Parser().parsestr(
            whl.read(f"fnserve-{fnserve.__version__}.dist-info/METADATA").decode()
        )
    source = REPO / "layers" / "fnserve"
    assert modules == {path.relative_to(source).as_posix() for path in (source / "fnserve").rglob("*.py")}
    gcp = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gcp"]
    shipped = [Requirement(line) for line in metadata.get_all("Requires-Dist", [])]
    assert sorted(map(_spec, map(Requirement, gcp))) == sorted(
        _spec(r) for r in shipped if 'extra == "gcp"' in str(r.marker)
    )
    venv = tmp_path / "venv"
    uv = str(Path(sys.executable).parent / "uv")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [uv, "pip", "install", "--quiet", "--native-tls", "--python", str(venv / "bin" / "python")]
        + ["-r", "requirements.txt"],
        cwd=api,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"FNSERVE_MANIFEST": str(api / "models" / "manifest.toml")}
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fnserve; print(fnserve.__file__)"],
        env=env,
        cwd=api,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    port = free_port()
    functions_framework = str(venv / "bin" / "functions-framework")
    serve = [functions_framework, "--target", "infer", "--source", str(api / "main.py"), "--port", str(port)]
    proc, url = start_http(serve + ["--host", "127.0.0.1"], port, tmp_path / "staged.log", env=env)
    try:
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
        assert httpx.post(f"{url}/v2/models/digits-fast/infer", json=body).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert f"from {api / 'models'}" in (tmp_path / "staged.log").read_text()
