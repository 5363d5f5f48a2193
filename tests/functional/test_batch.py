"""SQS batch jobs and the result cache against a real moto server (SQS, DynamoDB, S3 over HTTP)."""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from fnserve.adapters.lambda_.sqs import create_handler, records_of
from fnserve.aws import clients
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.bootstrap import build_dataplane, build_service
from fnserve.cli import app, explain
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.messages import job_message
from fnserve.core.jobs.processor import JobProcessor
from fnserve.core.jobs.results import ResultRecord, job_key
from fnserve.observability.emf import EmfWriter
from fnserve.settings import Settings
from fnserve.stores import job_client
from fnserve.stores.dynamodb import DynamoResultStore
from tests.embeddings import SENTENCES
from tests.helpers import DEMO_MANIFEST, REPO, sample_arrays, write_test_manifest
from tests.helpers.asgi import AsgiClient
from tests.helpers.clouds import Aws, received_event
from tests.helpers.jobs import ANONYMOUS_POISON, DIGITS, HOLDOUT, POISON, job, raw_job

SESSION = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"))
METRICS_PAGE = REPO / "docs" / "lambda-metrics.md"


def labels(x: np.ndarray) -> np.ndarray:
    return SESSION.run(["label"], {"input": x})[0]  # type: ignore[no-any-return]


def settings(aws: Aws, manifest: Path) -> Settings:
    return Settings(manifest=manifest, results_table=aws.table, results_bucket=aws.bucket)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_test_manifest(tmp_path)


class CountingService(InferenceService):
    """The real service, counting the vectorised calls it makes."""

    calls = 0

    def infer_many(self, *args: Any, **kwargs: Any) -> Any:
        CountingService.calls += 1
        return super().infer_many(*args, **kwargs)

    def infer_columns(self, *args: Any, **kwargs: Any) -> Any:
        CountingService.calls += 1
        return super().infer_columns(*args, **kwargs)


def count_calls(operation: str) -> list[int]:
    """Count a DynamoDB operation on fnserve's client from now on."""
    calls = [0]

    def hook(**_: Any) -> None:
        calls[0] += 1

    clients.client("dynamodb").meta.events.register(f"before-call.dynamodb.{operation}", hook)
    return calls


def poison_id(body: str) -> str:
    return str(json.loads(body)["id"])


def test_poison_records_fail_alone_and_good_results_are_stored(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    good = [job(f"good-{i}", slice(i * 3, i * 3 + 3)) for i in range(4)]
    poison = [body for body, _ in POISON.values()]
    bodies = [good[0], *ANONYMOUS_POISON.values(), *poison, *good[1:]]
    response = handler(sqs_event(bodies), LambdaContext())
    failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
    assert failed == {f"msg-{i:05d}" for i in range(1, 1 + len(ANONYMOUS_POISON))}
    found = job_client.fetch_results(aws.table, [f"good-{i}" for i in range(4)])
    assert not found.pending and not found.failed
    for i in range(4):
        np.testing.assert_array_equal(found.done[f"good-{i}"]["label"], labels(DIGITS[i * 3 : i * 3 + 3]))
        assert found.done[f"good-{i}"]["probabilities"].shape == (3, 10)
    reasons = job_client.fetch_results(aws.table, [poison_id(body) for body in poison])
    assert not reasons.done and not reasons.pending
    for body, reason in POISON.values():
        assert reason in reasons.failed[poison_id(body)]


def test_a_delivery_writes_one_emf_line_of_its_counts(
    aws: Aws, manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    handler = create_handler(settings=settings(aws, manifest))  # its own writer, on stdout as Lambda reads it
    poison = [body for body, _ in POISON.values()]
    bodies = [job("counted-0", slice(0, 2)), *ANONYMOUS_POISON.values(), *poison, job("counted-1", slice(2, 3))]
    capsys.readouterr()
    handler(sqs_event(bodies), LambdaContext())
    [doc] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Dimensions"] == [["service"]] and doc["service"] == "fnserve-batch"
    assert all(m["Unit"] == "Count" and m["Name"] in doc for m in directive["Metrics"])
    counts = {m["Name"]: doc[m["Name"]] for m in directive["Metrics"]}
    assert counts == {
        "JobsReceived": len(bodies),
        "JobsDone": 2,
        "JobsRefused": len(poison),
        "JobsFailed": len(ANONYMOUS_POISON),
        "JobsHandedBack": 0,
        "JobsSkipped": 0,
        "CacheHits": 0,
    }
    section = METRICS_PAGE.read_text().split("## The batch and follow-up functions", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE)) == set(counts), "docs/lambda-metrics.md"
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    quiet = io.StringIO()
    create_handler(settings=settings(aws, manifest), metrics=EmfWriter(out=quiet))(
        sqs_event(bodies[:1]), LambdaContext()
    )
    assert quiet.getvalue() == ""


def test_each_queues_function_writes_its_metrics_under_a_service_of_its_own() -> None:
    from cfnlint.decode.cfn_yaml import load

    resources = load(str(REPO / "template.yaml"))["Resources"]
    services = {
        name: resources[name]["Properties"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
        for name in ("BatchFunction", "BatchImageFunction", "FollowupFunction", "FollowupImageFunction")
    }
    assert services == {
        "BatchFunction": "fnserve-batch",
        "BatchImageFunction": "fnserve-batch",
        "FollowupFunction": "fnserve-followup",
        "FollowupImageFunction": "fnserve-followup",
    }
    assert "`fnserve-batch`" in METRICS_PAGE.read_text() and "`fnserve-followup`" in METRICS_PAGE.read_text()


@pytest.mark.parametrize("kind", list(POISON))
def test_one_poison_job_beside_a_good_one_fails_only_itself(aws: Aws, manifest: Path, kind: str) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    body, reason = POISON[kind]
    for bodies in ([job("neighbour", slice(5, 6)), body], [body, job("neighbour", slice(5, 6))]):
        assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
        found = job_client.fetch_results(aws.table, ["neighbour", poison_id(body)])
        np.testing.assert_array_equal(found.done["neighbour"]["label"], labels(DIGITS[5:6]))
        assert reason in found.failed[poison_id(body)]


def test_every_record_failing_reports_every_record(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    response = handler(sqs_event(["{", "[]"]), LambdaContext())
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == ["msg-00000", "msg-00001"]


def test_one_vectorised_call_per_model_and_results_written_once(aws: Aws, manifest: Path) -> None:
    service = CountingService.from_manifest(manifest)
    handler = create_handler(service=service, settings=settings(aws, manifest))
    bodies = [job(f"j-{i}", slice(i, i + 1)) for i in range(60)]
    bodies += [json.dumps(job_message(f"f-{i}", "digits-fast", {"input": DIGITS[i : i + 1]})) for i in range(5)]
    writes = count_calls("BatchWriteItem")
    CountingService.calls = 0
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    assert CountingService.calls == 2  # digits-accurate and digits-fast: one call each
    assert writes[0] == 3  # 65 results, 25 per BatchWriteItem
    # Redelivered (receive count 2) and already stored: not recomputed, not written again.
    reads = count_calls("BatchGetItem")
    assert handler(sqs_event(bodies, [2] * len(bodies)), LambdaContext()) == {"batchItemFailures": []}
    assert CountingService.calls == 2 and writes[0] == 3
    assert reads[0] == 1  # 65 redelivered keys: one BatchGetItem
    found = job_client.fetch_results(aws.table, [f"j-{i}" for i in range(60)])
    got = np.concatenate([found.done[f"j-{i}"]["label"] for i in range(60)])
    np.testing.assert_array_equal(got, labels(DIGITS[:60]))


def test_a_result_that_cannot_be_stored_is_redelivered(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    clients.client("dynamodb").delete_table(TableName=aws.table)  # every write now fails
    response = handler(sqs_event([job("lost-0", slice(0, 1)), job("lost-1", slice(1, 2))]), LambdaContext())
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == ["msg-00000", "msg-00001"]


def test_big_inputs_and_outputs_travel_through_s3(aws: Aws, manifest: Path, tmp_path: Path) -> None:
    rows = 40_000  # identity model: the FP64 output alone is 640 KB, over a DynamoDB item
    arrays = {f"in_{k}": np.resize(v, (rows, 2)) for k, v in sample_arrays().items()}
    jobs = iter([job_message("big-000000", "identity", arrays)])
    report = job_client.submit(aws.queue_url, jobs, bucket=aws.bucket)
    assert report.ids == ["big-000000"] and report.by_reference == 1
    event = received_event(aws, 1)
    handler = create_handler(settings=settings(aws, manifest))
    assert handler(event, LambdaContext()) == {"batchItemFailures": []}
    item = clients.client("dynamodb").get_item(TableName=aws.table, Key={"pk": {"S": job_key("big-000000")}})["Item"]
    assert "payload" not in item and item["payload_s3"]["S"].startswith("s3://fnserve-payloads/")
    out = job_client.fetch_results(aws.table, ["big-000000"]).done["big-000000"]
    for datatype, array in sample_arrays().items():
        got = out[f"out_{datatype}"]
        if datatype == "BYTES":
            assert got.ravel().tolist() == np.resize(array, (rows, 2)).ravel().tolist()
        else:
            np.testing.assert_array_equal(got, np.resize(array, (rows, 2)))


def test_submit_handler_results_round_trip(aws: Aws, manifest: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "digits.npz", input=DIGITS[:25], labels=HOLDOUT["labels"][:25])
    ids = tmp_path / "ids.txt"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "submit",
            str(tmp_path / "digits.npz"),
            "--queue",
            aws.queue_url,
            "--model",
            "digits-accurate",
            "--rows-per-job",
            "2",
            "--prefix",
            "rt",
            "--ids",
            str(ids),
        ],
    )
    assert result.exit_code == 0, result.output
    job_ids = ids.read_text().split()
    assert len(job_ids) == 13
    pending = runner.invoke(app, ["results", str(ids), "--table", aws.table, "-o", str(tmp_path / "r.jsonl")])
    assert "done 0, failed 0, pending 13" in pending.output
    handler = create_handler(settings=settings(aws, manifest))
    event = received_event(aws, 13)
    assert all("binary_data" in json.loads(r["body"]) for r in event["Records"])  # submit's default form
    assert handler(event, LambdaContext()) == {"batchItemFailures": []}
    result = runner.invoke(app, ["results", str(ids), "--table", aws.table, "-o", str(tmp_path / "r.npz")])
    assert "done 13, failed 0, pending 0" in result.output, result.output
    stored = np.load(tmp_path / "r.npz")
    assert stored["ids"].tolist() == job_ids
    np.testing.assert_array_equal(stored["label"], labels(DIGITS[:25]))
    runner.invoke(app, ["results", str(ids), "--table", aws.table, "-o", str(tmp_path / "r.jsonl")])
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["status"] for line in lines] == ["done"] * 13
    assert lines[0]["outputs"]["label"] == labels(DIGITS[:2]).tolist()
    several = runner.invoke(app, ["results", str(ids), "--table", aws.table, "-o", str(tmp_path / "r.npy")])
    assert several.exit_code == 1 and "a .npy holds one, use .npz or .jsonl" in several.output
    printed = runner.invoke(app, ["results", str(ids), "--table", aws.table])  # no -o: JSON lines on stdout
    assert printed.exit_code == 0, printed.output
    assert [json.loads(line) for line in printed.stdout.splitlines()] == lines
    assert "done 13, failed 0, pending 0" in printed.stderr
    nowhere = runner.invoke(app, ["results", str(ids)], env={"FNSERVE_RESULTS_TABLE": "", "FNSERVE_RESULTS": ""})
    assert nowhere.exit_code == 1 and "--table" in nowhere.output and "not both" not in nowhere.output


def test_results_from_a_table_that_does_not_exist_name_the_table(aws: Aws, tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("some-job\n")
    result = CliRunner().invoke(app, ["results", str(ids), "--table", "nope"])
    assert result.exit_code != 0 and result.exception is not None
    said = explain(result.exception)  # the line the fnserve script prints after "error: "
    assert said == "reading results from DynamoDB table 'nope': it does not exist", said


def test_expired_items_are_ignored_on_read(aws: Aws) -> None:
    store = DynamoResultStore(aws.table)
    assert store.put([ResultRecord("job#old", "done", "m", "1", 0, 1, payload=b"x")]) == set()
    assert store.put([ResultRecord("job#new", "done", "m", "1", 0, 4_000_000_000, payload=b"y")]) == set()
    assert list(store.get(["job#old", "job#new"])) == ["job#new"]


def test_cache_hits_on_the_http_path_and_across_processes(aws: Aws, tmp_path: Path) -> None:
    from fnserve.adapters.http.app import create_app

    cached = settings(aws, write_test_manifest(tmp_path, cache_ttl=3600))
    body = {"inputs": [{"name": "input", "shape": [2, 64], "datatype": "FP32", "data": DIGITS[:2].ravel().tolist()}]}
    first = AsgiClient(create_app(build_dataplane(cached), cached))
    responses = [first.post("/v2/models/digits-accurate/infer", json=body) for _ in range(2)]
    assert [r.headers["x-fnserve-cache"] for r in responses] == ["miss", "hit"]
    assert responses[1].json()["parameters"] == {"cache": "hit"}
    assert responses[0].json()["outputs"] == responses[1].json()["outputs"]
    # A new process (empty in-process tier) finds the result in DynamoDB.
    second = AsgiClient(create_app(build_dataplane(cached), cached))
    assert second.post("/v2/models/digits-accurate/infer", json=body).headers["x-fnserve-cache"] == "hit"
    other = {**body, "outputs": [{"name": "label"}]}  # other outputs: another key
    assert second.post("/v2/models/digits-accurate/infer", json=other).headers["x-fnserve-cache"] == "miss"
    uncached = AsgiClient(create_app(build_dataplane(settings(aws, tmp_path / "manifest.toml")), cached))
    assert "x-fnserve-cache" in uncached.post("/v2/models/digits-accurate/infer", json=body).headers


def test_cache_on_the_sqs_path_infers_only_misses(aws: Aws, tmp_path: Path) -> None:
    cached = settings(aws, write_test_manifest(tmp_path, cache_ttl=3600))
    store = DynamoResultStore(aws.table)
    processor = JobProcessor(build_service(cached, store), store, ttl_seconds=3600)
    first = processor.process(records_of(sqs_event([job(f"a-{i}", slice(i, i + 1)) for i in range(8)])))
    assert (first.done, first.cache_hits, first.failures) == (8, 0, [])
    gets = count_calls("BatchGetItem")
    again = [job(f"b-{i}", slice(i, i + 1)) for i in range(6)] + [job("b-new", slice(20, 21))]
    second = JobProcessor(build_service(cached, store), store, ttl_seconds=3600).process(records_of(sqs_event(again)))
    assert (second.done, second.cache_hits) == (7, 6)
    assert gets[0] == 1  # all seven cache keys in one BatchGetItem
    found = job_client.fetch_results(aws.table, [f"b-{i}" for i in range(6)] + ["b-new"])
    np.testing.assert_array_equal(found.done["b-new"]["label"], labels(DIGITS[20:21]))


@pytest.mark.parametrize(("function", "event_file"), [("batch", "batch-jobs.json"), ("followup", "followup-jobs.json")])
def test_the_job_functions_handle_their_sample_events(
    aws: Aws, monkeypatch: pytest.MonkeyPatch, function: str, event_file: str
) -> None:
    from tests.helpers import REPO
    from tests.helpers.functions import load_function

    monkeypatch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
    monkeypatch.setenv("FNSERVE_RESULTS_TABLE", aws.table)
    monkeypatch.setenv("FNSERVE_RESULTS_BUCKET", aws.bucket)
    handler = load_function(REPO / "functions" / function / "app.py").handler
    event = json.loads((REPO / "events" / event_file).read_text())
    response = handler(event, LambdaContext())
    assert response == {"batchItemFailures": []}  # the poisoned fifth job is stored as failed instead
    ids = [json.loads(r["body"])["id"] for r in event["Records"][:4]]
    poison = json.loads(event["Records"][4]["body"])["id"]
    assert "'inputs' must be a non-empty list" in job_client.fetch_results(aws.table, [poison]).failed[poison]
    models = [json.loads(r["body"])["model"] for r in event["Records"][:4]]
    found = job_client.fetch_results(aws.table, ids)
    for i, (job_id, model) in enumerate(zip(ids, models, strict=True)):
        session = ort.InferenceSession(str(DEMO_MANIFEST.parent / model / "1" / "model.onnx"))
        expected = session.run(["label"], {"input": DIGITS[i * 2 : i * 2 + 2]})[0]
        np.testing.assert_array_equal(found.done[job_id]["label"], expected)


@pytest.mark.parametrize("function", ["batch", "followup"])
def test_the_job_functions_take_fnserves_log_level_over_powertools(
    aws: Aws, monkeypatch: pytest.MonkeyPatch, function: str
) -> None:
    from fnserve.observability.logs import logger
    from tests.helpers import REPO
    from tests.helpers.functions import load_function

    monkeypatch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
    monkeypatch.setenv("FNSERVE_RESULTS_TABLE", aws.table)
    monkeypatch.setenv("FNSERVE_RESULTS_BUCKET", aws.bucket)
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "DEBUG")
    try:
        monkeypatch.setenv("FNSERVE_LOG_LEVEL", "ERROR")
        load_function(REPO / "functions" / function / "app.py")
        assert logger.log_level == logging.ERROR
        monkeypatch.delenv("FNSERVE_LOG_LEVEL")  # then Powertools' own variable
        load_function(REPO / "functions" / function / "app.py")
        assert logger.log_level == logging.DEBUG
    finally:
        logger.setLevel("INFO")


def test_the_batch_function_refuses_to_start_without_a_results_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from fnserve.adapters.gcp.jobs import create_function
    from fnserve.core.errors import ConfigError
    from fnserve.observability import logs

    monkeypatch.delenv("FNSERVE_RESULTS_TABLE", raising=False)
    monkeypatch.delenv("FNSERVE_RESULTS", raising=False)
    monkeypatch.setattr(logs, "_cloud", False)  # the GCP function turns Cloud Logging's shape on: back after
    for create in (create_handler, create_function):  # the SQS and the Pub/Sub functions alike
        with pytest.raises(ConfigError, match=r"needs FNSERVE_RESULTS \(a Redis URL.*or FNSERVE_RESULTS_TABLE"):
            create(settings=Settings(manifest=DEMO_MANIFEST))


def test_a_bad_value_inside_a_uniform_group_fails_only_its_job(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    bodies = [job(f"u-{i}", slice(i, i + 1)) for i in range(6)]
    bad_value = json.loads(bodies[2])
    bad_value["inputs"][0]["data"][5] = "x"
    short = json.loads(bodies[4])
    short["inputs"][0]["data"] = short["inputs"][0]["data"][:63]  # same declared shape, 63 values
    bodies[2], bodies[4] = json.dumps(bad_value), json.dumps(short)
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    found = job_client.fetch_results(aws.table, [f"u-{i}" for i in range(6)])
    assert sorted(found.done) == ["u-0", "u-1", "u-3", "u-5"]
    assert "FP32 data must be numbers, got strings" in found.failed["u-2"]
    assert "needs 64 elements, data has 63" in found.failed["u-4"]


def test_bad_binary_jobs_inside_a_uniform_binary_group_fail_only_themselves(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    messages = [job_message(f"b-{i}", "digits-accurate", {"input": DIGITS[i : i + 1]}, binary=True) for i in range(6)]
    # Same structure as their neighbours (so stacked with them), 252 and 260 bytes where 256 are
    # declared: together the right total, so only a per-job check keeps the rows from shifting.
    messages[3]["binary_data"] = base64.b64encode(DIGITS[3:4].astype(np.float32).tobytes()[:252]).decode()
    messages[4]["binary_data"] = base64.b64encode(DIGITS[4:5].astype(np.float32).tobytes() + bytes(4)).decode()
    assert handler(sqs_event([json.dumps(m) for m in messages]), LambdaContext()) == {"batchItemFailures": []}
    found = job_client.fetch_results(aws.table, [f"b-{i}" for i in range(6)])
    assert sorted(found.done) == ["b-0", "b-1", "b-2", "b-5"]
    assert "claims 256 binary bytes but only 252 remain" in found.failed["b-3"]
    assert "4 bytes of binary data follow the JSON" in found.failed["b-4"]
    for i in (0, 1, 2, 5):
        np.testing.assert_array_equal(found.done[f"b-{i}"]["label"], labels(DIGITS[i : i + 1]))


def test_binary_and_json_jobs_give_the_same_results(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    x = {"input": DIGITS[:3]}
    bodies = [
        json.dumps(job_message("as-json", "digits-accurate", x)),
        json.dumps(job_message("as-binary", "digits-accurate", x, binary=True)),
    ]
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    found = job_client.fetch_results(aws.table, ["as-json", "as-binary"])
    for name in ("label", "probabilities"):
        np.testing.assert_array_equal(found.done["as-json"][name], found.done["as-binary"][name])


def test_a_partly_stored_redelivered_group_runs_only_the_rest(aws: Aws, manifest: Path) -> None:
    service = CountingService.from_manifest(manifest)
    handler = create_handler(service=service, settings=settings(aws, manifest))
    first = [job(f"r-{i}", slice(i, i + 1)) for i in range(10)]
    assert handler(sqs_event(first), LambdaContext()) == {"batchItemFailures": []}
    writes = count_calls("BatchWriteItem")
    more = first + [job(f"r-{i}", slice(i, i + 1)) for i in range(10, 15)]
    assert handler(sqs_event(more, [2] * 15), LambdaContext()) == {"batchItemFailures": []}
    assert writes[0] == 1  # the five new results only
    found = job_client.fetch_results(aws.table, [f"r-{i}" for i in range(15)])
    got = np.concatenate([found.done[f"r-{i}"]["label"] for i in range(15)])
    np.testing.assert_array_equal(got, labels(DIGITS[:15]))


def test_a_manifest_in_s3_loads_its_models_from_the_same_bucket(aws: Aws, tmp_path: Path) -> None:
    s3 = clients.client("s3")
    models = DEMO_MANIFEST.parent
    s3.put_object(Bucket=aws.bucket, Key="models/manifest.toml", Body=DEMO_MANIFEST.read_bytes())
    model = models / "digits-fast" / "1" / "model.onnx"
    s3.put_object(Bucket=aws.bucket, Key="models/digits-fast/1/model.onnx", Body=model.read_bytes())
    service = build_service(Settings(manifest=f"s3://{aws.bucket}/models/manifest.toml", model_cache_dir=tmp_path))
    out = service.predict("digits-fast", {"input": DIGITS[:4]})
    fast = ort.InferenceSession(str(model))
    np.testing.assert_array_equal(out["label"], fast.run(["label"], {"input": DIGITS[:4]})[0])
    assert service.registry.get("digits-fast").path == tmp_path / "digits-fast" / "1" / "model.onnx"


def test_the_same_job_twice_in_one_batch_is_stored_once_and_fails_nothing(aws: Aws, manifest: Path) -> None:
    handler = create_handler(settings=settings(aws, manifest))
    bodies = [job("twice", slice(0, 1)), job("other", slice(1, 2)), job("twice", slice(0, 1))]
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    found = job_client.fetch_results(aws.table, ["twice", "other"])
    np.testing.assert_array_equal(found.done["twice"]["label"], labels(DIGITS[0:1]))
    assert sorted(found.done) == ["other", "twice"]


@pytest.mark.parametrize(
    ("code", "status", "own_fault"),
    [("AccessDenied", 403, True), ("SlowDown", 503, False), ("InternalError", 500, False)],
)
def test_s3_errors_fail_only_the_job_that_references_the_object(
    aws: Aws, manifest: Path, code: str, status: int, own_fault: bool
) -> None:
    """Deployed without s3:ListBucket, S3 answers a missing object with AccessDenied: the job's own fault.
    Throttling and S3's own faults may heal: that job alone is redelivered, and stored as failed at last."""
    from botocore.stub import Stubber

    handler = create_handler(settings=settings(aws, manifest))
    body = raw_job("by-ref", payload={"uri": f"s3://{aws.bucket}/jobs/by-ref.json"})
    for receive_count in (1, 5):
        with Stubber(clients.client("s3")) as s3:
            s3.add_client_error("get_object", service_error_code=code, http_status_code=status)
            response = handler(sqs_event([job("beside", slice(0, 1)), body], [receive_count] * 2), LambdaContext())
        found = job_client.fetch_results(aws.table, ["beside", "by-ref"])
        np.testing.assert_array_equal(found.done["beside"]["label"], labels(DIGITS[0:1]))
        if own_fault or receive_count == 5:  # 5: the queues' maxReceiveCount, the last delivery
            assert "by-ref.json cannot be read" in found.failed["by-ref"]
        else:
            assert found.pending == ["by-ref"]
        redelivered = not own_fault
        assert response == {"batchItemFailures": [{"itemIdentifier": "msg-00001"}] if redelivered else []}


def test_jobs_naming_a_cascade_get_the_slow_models_answer_only_where_the_fast_one_is_unsure(
    aws: Aws, tmp_path: Path
) -> None:
    from fnserve.core.jobs.cascade import confidence
    from fnserve.core.models.manifest.loading import load_manifest

    manifest = write_test_manifest(tmp_path, cascade=True)
    cascade = load_manifest(manifest).cascades[0]
    fast_session = ort.InferenceSession(str(DEMO_MANIFEST.parent / "digits-fast" / "1" / "model.onnx"))
    rows = DIGITS[:60]
    fast_label, fast_probabilities = fast_session.run(["label", "probabilities"], {"input": rows})
    unsure = confidence(fast_probabilities, cascade) < cascade.threshold
    assert 0 < unsure.sum() < len(rows)  # the holdout has both kinds
    handler = create_handler(settings=settings(aws, manifest))
    bodies = [json.dumps(job_message(f"c-{i}", "digits", {"input": rows[i : i + 1]})) for i in range(len(rows))]
    bodies.append(json.dumps(job_message("c-label", "digits", {"input": rows[:1]}, outputs=["label"])))
    bodies.append(json.dumps(job_message("c-version", "digits", {"input": rows[:1]}, version="1")))
    assert handler(sqs_event(bodies), LambdaContext()) == {"batchItemFailures": []}
    ids = [f"c-{i}" for i in range(len(rows))]
    records = DynamoResultStore(aws.table).get([job_key(i) for i in [*ids, "c-label", "c-version"]])
    for i, job_id in enumerate(ids):
        record = records[job_key(job_id)]
        assert record.status == "done"
        assert record.model == "digits"  # what the job called, and beside it which model answered
        assert record.answered_by == ("digits-accurate" if unsure[i] else "digits-fast")
        expected = labels(rows[i : i + 1]) if unsure[i] else fast_label[i : i + 1]
        np.testing.assert_array_equal(record.outputs()["label"], expected)
    assert list(records[job_key("c-label")].outputs()) == ["label"]
    assert records[job_key("c-version")].status == "failed"
    assert "a cascade has no versions" in (records[job_key("c-version")].error or "")


class Invocation(LambdaContext):
    """A Lambda context of ``seconds`` left: Lambda's own clock, counting down from its invocation."""

    def __init__(self, seconds: float) -> None:
        super().__init__(timeout=seconds)


def test_a_batch_out_of_time_stores_what_ran_and_hands_back_the_rest_most_delivered_first(aws: Aws) -> None:
    # Text jobs of 60 words each: 200 of them need more time than the invocation has left after its reserves.
    words = " ".join(SENTENCES).split()
    texts = {f"t-{i}": " ".join(words[i * 7 : i * 7 + 60]) for i in range(300)}
    bodies = {
        job_id: json.dumps(job_message(job_id, "minilm-embed", {"text": np.array([text], dtype=object)}))
        for job_id, text in texts.items()
    }
    ids = list(bodies)
    handler = create_handler(settings=settings(aws, DEMO_MANIFEST))

    def deliver(batch: list[str], counts: list[int], seconds: float) -> set[str]:
        event = sqs_event([bodies[j] for j in batch], counts, id_prefix="m-")
        message = {r["messageId"]: j for r, j in zip(event["Records"], batch, strict=True)}
        answer = handler(event, Invocation(seconds))
        return {message[f["itemIdentifier"]] for f in answer["batchItemFailures"]}

    # The invocation's time scaled to this CPU: some 80 jobs' work once its reserves for the answer and the store
    # (shares of it, this short) are set aside, at the pace of 64 other jobs (the faster of two runs: a cold first
    # run of the shapes, or another test's load, would leave time for more).
    def paced(round_: int) -> float:
        texts = [" ".join(words[i * 11 + round_ : i * 11 + round_ + 60]) for i in range(64)]  # never cache hits
        bodies = [
            json.dumps(job_message(f"w{round_}-{i}", "minilm-embed", {"text": np.array([t], dtype=object)}))
            for i, t in enumerate(texts)
        ]
        started = time.perf_counter()
        event = sqs_event(bodies, [1] * 64, id_prefix=f"w{round_}-")
        assert handler(event, Invocation(120.0))["batchItemFailures"] == []
        return (time.perf_counter() - started) / 64

    short = max(1.0, 80 * min(paced(5), paced(6)) / 0.7)

    first = ids[:200]
    handed = deliver(first, [1] * 200, short)
    done = set(first) - handed
    assert len(done) >= 64 and len(handed) > 50, f"{len(done)} done, {len(handed)} handed back"
    found = job_client.fetch_results(aws.table, first)
    assert set(found.done) == done and not found.failed  # what ran is stored; what did not is not failed
    # Redelivered beside fresh jobs, again short of time: the handed-back ones run first.
    fresh = ids[200:]
    again = deliver([*handed, *fresh], [2] * len(handed) + [1] * len(fresh), short)
    assert set(fresh) <= again or not (set(handed) & again), "a fresh job ran while a handed-back one waited"
    # With time enough, the rest: every job done once, none failed, nothing handed back.
    rest = sorted(again)
    assert deliver(rest, [3 if j in handed else 2 for j in rest], 120.0) == set()
    found = job_client.fetch_results(aws.table, ids)
    assert set(found.done) == set(ids) and not found.failed and not found.pending
