"""Cold start of the Lambda functions: a fresh process to the first answer, beside its floor and peer.

    make bench        (or: python -m tests.bench.bench_cold)

Every figure comes from new Python processes, interleaved (so disk cache and CPU noise hit
all alike), median of BENCH_COLD_RUNS:

- floor: a bare script that imports onnxruntime + numpy, creates the digits-accurate
  session and runs it once;
- API: ``functions/api/app.py`` imported as Lambda imports it, then one API Gateway v2
  inference event (``events/api-http-infer.json``), beside the naive Mangum + FastAPI + ORT
  handler (tests/bench/plain_server.py) answering the same event;
- batch: ``functions/batch/app.py`` imported, then one SQS event (``events/batch-jobs.json``,
  fresh job ids each run) whose results are written to DynamoDB on a local moto server,
  beside a naive boto3 + ORT handler doing the same writes, and the batch function's
  import alone (its init phase).

Then SnapStart, emulated: the API function is imported with the runtime's hook module in
place, its before-snapshot hook is run (the snapshot would be taken here), and the time is
taken from "restore" (the after-restore hooks) to the first answer, with and without the
before-snapshot hook (without it, the first request loads the model). Last,
``python -X importtime``'s ten most expensive top-level packages (self time summed) for each
function's path to its first answer.
"""

from __future__ import annotations

import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench._timing import fresh_process_seconds
from tests.helpers import DEMO_MANIFEST, REPO
from tests.moto import aws_env, moto_server

COLD_RUNS = int(os.environ.get("BENCH_COLD_RUNS", "11"))
MODEL_PATH = DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"
TABLE = "fnserve-cold-results"

FLOOR = f"""
import numpy as np, onnxruntime as ort
s = ort.InferenceSession({str(MODEL_PATH)!r}, providers=["CPUExecutionProvider"])
s.run(None, {{"input": np.zeros((1, 64), np.float32)}})
"""

CONTEXT = """
class Context:
    aws_request_id = "cold-1"
    function_name = "fn"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:fn"
"""

API = f"""
import json, sys
sys.path.insert(0, {str(REPO / "functions" / "api")!r})
import app
{CONTEXT}
event = json.load(open({str(REPO / "events" / "api-http-infer.json")!r}))
assert app.handler(event, Context())["statusCode"] == 200
"""

NAIVE_API = f"""
import json
from tests.bench.plain_server import handler
{CONTEXT}
event = json.load(open({str(REPO / "events" / "api-http-infer.json")!r}))
assert handler(event, Context())["statusCode"] == 200
"""

BATCH_EVENT = f"""
import json, uuid
event = json.load(open({str(REPO / "events" / "batch-jobs.json")!r}))
run = uuid.uuid4().hex
for record in event["Records"]:
    job = json.loads(record["body"])
    if isinstance(job, dict) and isinstance(job.get("id"), str):
        job["id"] += "-" + run
    record["body"] = json.dumps(job)
"""

BATCH = f"""
import sys
sys.path.insert(0, {str(REPO / "functions" / "batch")!r})
import app
{CONTEXT}
{BATCH_EVENT}
assert app.handler(event, Context()) == {{"batchItemFailures": []}}
"""

BATCH_INIT = f"""
import sys
sys.path.insert(0, {str(REPO / "functions" / "batch")!r})
import app
"""

SNAPSTART = f"""
import json, sys, time, types
hooks = {{"before": [], "after": []}}
runtime = types.ModuleType("snapshot_restore_py")
runtime.register_before_snapshot = hooks["before"].append
runtime.register_after_restore = hooks["after"].append
sys.modules["snapshot_restore_py"] = runtime
sys.path.insert(0, {str(REPO / "functions" / "api")!r})
import app
{CONTEXT}
event = json.load(open({str(REPO / "events" / "api-http-infer.json")!r}))
if WARM:
    for hook in hooks["before"]:
        hook()
t0 = time.perf_counter()  # restored from the snapshot
for hook in hooks["after"]:
    hook()
assert app.handler(event, Context())["statusCode"] == 200
print("restore-to-answer", time.perf_counter() - t0)
"""


def restore_seconds(warm: bool, env: dict[str, str]) -> float:
    code = SNAPSTART.replace("WARM", str(warm))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    out = done.stdout
    return float(out.split("restore-to-answer")[-1])


# What one would write by hand: parse each job, run it, put its outputs in the table.
NAIVE_BATCH = f"""
import json, time
import boto3, numpy as np, onnxruntime as ort
session = ort.InferenceSession({str(MODEL_PATH)!r}, providers=["CPUExecutionProvider"])
dynamodb = boto3.client("dynamodb")
{BATCH_EVENT}
for record in event["Records"]:
    try:
        job = json.loads(record["body"])
        tensor = job["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        label, probabilities = session.run(None, {{"input": x}})
    except Exception as exc:
        continue
    item = {{"pk": {{"S": "job#" + job["id"]}}, "status": {{"S": "done"}},
            "label": {{"S": json.dumps(label.tolist())}}, "probabilities": {{"B": probabilities.tobytes()}},
            "expires_at": {{"N": str(int(time.time()) + 86400)}}}}
    dynamodb.put_item(TableName={TABLE!r}, Item=item)
"""


def _create_table(env: dict[str, str]) -> None:
    code = f"""
import boto3
boto3.client("dynamodb").create_table(
    TableName={TABLE!r},
    KeySchema=[{{"AttributeName": "pk", "KeyType": "HASH"}}],
    AttributeDefinitions=[{{"AttributeName": "pk", "AttributeType": "S"}}],
    BillingMode="PAY_PER_REQUEST",
)
"""
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)


def import_top10(code: str, env: dict[str, str]) -> list[tuple[str, float]]:
    """``python -X importtime``'s self times summed by top-level package, the ten largest, in ms."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stderr
    totals: collections.Counter[str] = collections.Counter()
    for line in out.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s+(\S+)", line)
        if match:
            totals[match.group(2).split(".")[0]] += int(match.group(1)) / 1e3
    return totals.most_common(10)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fnserve-cold-"))
    with moto_server(tmp / "moto.log") as url:
        base = {**os.environ, "PYTHONPATH": str(REPO), "PLAIN_MODEL_PATH": str(MODEL_PATH)}
        base.pop("FNSERVE_RESULTS_TABLE", None)
        api_env = {**base, "FNSERVE_MANIFEST": str(DEMO_MANIFEST)}
        batch_env = {**api_env, **aws_env(url), "FNSERVE_RESULTS_TABLE": TABLE}
        _create_table(batch_env)
        scripts = {
            "floor: bare onnxruntime script": (FLOOR, base),
            "API: naive Mangum + FastAPI + ORT": (NAIVE_API, base),
            "API: functions/api/app.py": (API, api_env),
            "batch: naive boto3 + ORT (DynamoDB writes)": (NAIVE_BATCH, batch_env),
            "batch: functions/batch/app.py (DynamoDB writes)": (BATCH, batch_env),
            "batch: functions/batch/app.py init only": (BATCH_INIT, batch_env),
        }
        times: dict[str, list[float]] = {label: [] for label in scripts}
        for _ in range(COLD_RUNS):
            for label, (code, env) in scripts.items():
                times[label].append(fresh_process_seconds(code, env=env, cwd=REPO))
        med = {label: statistics.median(samples) for label, samples in times.items()}
        floor = med["floor: bare onnxruntime script"]
        print(f"cold start: fresh process -> first answer, median of {COLD_RUNS} interleaved runs")
        peers = {
            "API: functions/api/app.py": "API: naive Mangum + FastAPI + ORT",
            "batch: functions/batch/app.py (DynamoDB writes)": "batch: naive boto3 + ORT (DynamoDB writes)",
        }
        for label, seconds in med.items():
            peer = f"  {seconds / med[peers[label]]:5.2f}x its naive peer" if label in peers else ""
            print(f"  {label:<50}{seconds * 1e3:8.1f} ms  {seconds / floor:5.2f}x floor{peer}")
        restore: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(COLD_RUNS):
            for warm in (False, True):
                restore[warm].append(restore_seconds(warm, api_env))
        cold, warm = (statistics.median(restore[w]) for w in (False, True))
        print(f"  SnapStart (emulated), API function, restore -> first answer, median of {COLD_RUNS}:")
        print(f"    without the before-snapshot hook {cold * 1e3:7.2f} ms (the first request loads the model)")
        print(f"    with it (every model warm)       {warm * 1e3:7.2f} ms  {warm / cold:5.2f}x")
        for label, (code, env) in (("API", (API, api_env)), ("batch", (BATCH, batch_env))):
            top = ", ".join(f"{name} {ms:.0f}" for name, ms in import_top10(code, env))
            print(f"  python -X importtime, {label} function, top 10 packages (self ms): {top}")


if __name__ == "__main__":
    main()
