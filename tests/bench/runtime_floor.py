"""The Lambda start floor: a bare Runtime API loop that answers the same events as the functions, with their models.

    python tests/bench/runtime_floor.py api MODELS_DIR      (AWS_LAMBDA_RUNTIME_API set; bench_start runs it)
    python tests/bench/runtime_floor.py batch MODELS_DIR    (and TABLE: the jobs' results written to DynamoDB)

GET the next event, run onnxruntime, POST the answer: what any function answering these events through the Runtime
API pays at least. ``api`` answers an API Gateway v2 V2-inference event with the model's outputs; ``batch`` runs
each SQS job on the model it names (each loaded when a job first names it), writes every job's result (or its
failure) to the table in one batch write, and answers no failed records. No fnserve and no awslambdaric: run by
path, it imports the standard library, numpy, onnxruntime and (batch) boto3 alone.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from typing import Any

import numpy as np
import onnxruntime as ort

NEXT = "/2018-06-01/runtime/invocation/next"
kind, models = sys.argv[1], sys.argv[2]
sessions: dict[str, ort.InferenceSession] = {}


def session(name: str) -> ort.InferenceSession:
    if name not in sessions:
        path = os.path.join(models, name, "1", "model.onnx")
        sessions[name] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sessions[name]


def run(name: str, tensor: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
    x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    return session(name).run(None, {"input": x})  # type: ignore[no-any-return]


def api(event: dict[str, Any]) -> dict[str, Any]:
    name = event["rawPath"].split("/")[3]  # /v2/models/{name}/infer
    outputs = run(name, json.loads(event["body"])["inputs"][0])
    tensors = [
        {"name": o.name, "shape": list(a.shape), "data": a.ravel().tolist()}
        for o, a in zip(session(name).get_outputs(), outputs, strict=True)
    ]
    body = json.dumps({"model_name": name, "outputs": tensors})
    return {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": body}


if kind == "batch":
    import boto3

    dynamodb = boto3.client("dynamodb")
    table = os.environ["TABLE"]


def batch(event: dict[str, Any]) -> dict[str, Any]:
    items = []
    for record in event["Records"]:
        job = json.loads(record["body"])
        item: dict[str, dict[str, Any]] = {
            "pk": {"S": f"job#{job['id']}"},
            "expires_at": {"N": str(int(time.time()) + 86400)},
        }
        try:
            label, probabilities = run(job["model"], job["inputs"][0])
        except Exception as exc:  # a job that is no tensors fails alone
            item |= {"status": {"S": "failed"}, "error": {"S": str(exc)}}
        else:
            item |= {"status": {"S": "done"}, "label": {"S": json.dumps(label.tolist())}}
            item["probabilities"] = {"B": probabilities.tobytes()}
        items.append({"PutRequest": {"Item": item}})
    dynamodb.batch_write_item(RequestItems={table: items})
    return {"batchItemFailures": []}


host, port = os.environ["AWS_LAMBDA_RUNTIME_API"].split(":")
runtime = http.client.HTTPConnection(host, int(port))
answer = api if kind == "api" else batch
while True:
    runtime.request("GET", NEXT)
    response = runtime.getresponse()
    event = json.loads(response.read())
    request_id = response.getheader("lambda-runtime-aws-request-id")
    runtime.request("POST", f"/2018-06-01/runtime/invocation/{request_id}/response", json.dumps(answer(event)))
    runtime.getresponse().read()
