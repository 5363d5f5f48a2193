"""Write real-shaped Lambda events (as `sam local generate-event` makes them) carrying demo-model
requests on held-out digits: events/ holds those of what template.yaml deploys (its HTTP API's
routes, its queues); tests/events/ those of integrations the handler also accepts that the
template does not deploy (a REST API, an Application Load Balancer).

    python infra/events/make_events.py        (rerun when the demo models change)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fnserve.aws.events import ACCOUNT_ID, REGION, http_api_event, rest_api_event, sqs_event

REPO = Path(__file__).resolve().parents[2]

EVENTS = REPO / "events"
OTHER_EVENTS = REPO / "tests" / "events"
# The template's HTTP API sends every request through one route (template.yaml, HttpApiRoute).
ROUTE_KEY = "ANY /v2/{proxy+}"
HOLDOUT = np.load(REPO / "layers" / "models" / "models" / "digits-holdout.npz")
MODEL = "digits-accurate"
PATH = f"/v2/models/{MODEL}/infer"
TIME, EPOCH = "22/Nov/2026:04:20:00 +0000", 1795321200000


def json_body(rows: slice) -> bytes:
    x = HOLDOUT["input"][rows]
    request = {
        "id": f"digits-{rows.start}-{rows.stop}",
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
    }
    return json.dumps(request, separators=(",", ":")).encode()


def binary_body(rows: slice) -> tuple[bytes, int]:
    x = np.ascontiguousarray(HOLDOUT["input"][rows], dtype="<f4")
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        },
        separators=(",", ":"),
    ).encode()
    return head + x.tobytes(), len(head)


def headers(body: bytes, content_type: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "accept": "*/*",
        "content-length": str(len(body)),
        "content-type": content_type,
        "host": "abcdef1234.execute-api.us-east-1.amazonaws.com",
        "user-agent": "python-requests/2.32",
        "x-amzn-trace-id": "Root=1-6740a1b0-3c1f6b2e4f5a6b7c8d9e0f1a",
        "x-forwarded-for": "192.0.2.10",
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https",
        **(extra or {}),
    }


# The caller's identity as API Gateway's IAM authorizer reports it (one sample user of the fake account).
CALLER = {
    "accessKey": "AKIAIOSFODNN7EXAMPLE",
    "accountId": ACCOUNT_ID,
    "caller": "AIDACKCEVSQ6C2EXAMPLE",
    "userArn": f"arn:aws:iam::{ACCOUNT_ID}:user/ml-engineer",
    "userAgent": "python-requests/2.32",
}
DOMAIN = f"abcdef1234.execute-api.{REGION}.amazonaws.com"


def http_api(method: str, path: str, body: bytes | None, hdrs: dict[str, str], binary: bool = False) -> dict[str, Any]:
    """API Gateway HTTP API, payload format 2.0."""
    return http_api_event(
        method,
        path,
        route_key=ROUTE_KEY,
        headers=hdrs,
        body=body,
        binary=binary,
        path_parameters={"proxy": path.removeprefix("/v2/")},
        source_ip="192.0.2.10",
        api_id="abcdef1234",
        domain=DOMAIN,
        request_id="c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
        epoch_ms=EPOCH,
        authorizer={
            "iam": {
                "accessKey": CALLER["accessKey"],
                "accountId": ACCOUNT_ID,
                "callerId": CALLER["caller"],
                "principalOrgId": None,
                "userArn": CALLER["userArn"],
                "userId": CALLER["caller"],
            }
        },
    )


def rest_api(body: bytes, hdrs: dict[str, str], binary: bool = False) -> dict[str, Any]:
    """API Gateway REST API, Lambda proxy integration (payload format 1.0)."""
    return rest_api_event(
        "POST",
        PATH,
        resource="/v2/models/{name}/infer",
        headers={k: [v] for k, v in hdrs.items()},
        body=body,
        binary=binary,
        path_parameters={"name": MODEL},
        stage="prod",
        source_ip="192.0.2.10",
        api_id="abcdef1234",
        request_id="e0dd3f2a-8e9c-4b1d-9f32-6c2b1a0e7d11",
        context={
            "resourceId": "2gxmpl",
            "extendedRequestId": "JJbxmHEHPHcFYXg=",
            "requestTime": TIME,
            "protocol": "HTTP/1.1",
            "domainPrefix": "abcdef1234",
            "requestTimeEpoch": EPOCH,
            "identity": {
                "cognitoIdentityPoolId": None,
                "accountId": ACCOUNT_ID,
                "cognitoIdentityId": None,
                "caller": CALLER["caller"],
                "sourceIp": "192.0.2.10",
                "principalOrgId": None,
                "accessKey": CALLER["accessKey"],
                "cognitoAuthenticationType": None,
                "cognitoAuthenticationProvider": None,
                "userArn": CALLER["userArn"],
                "userAgent": CALLER["userAgent"],
                "user": CALLER["caller"],
            },
            "domainName": DOMAIN,
        },
    )


def alb(body: bytes, hdrs: dict[str, str]) -> dict[str, Any]:
    """Application Load Balancer target group event."""
    return {
        "requestContext": {
            "elb": {
                "targetGroupArn": f"arn:aws:elasticloadbalancing:{REGION}:{ACCOUNT_ID}:"
                "targetgroup/fnserve/6d0ecf831eec9f09"
            }
        },
        "httpMethod": "POST",
        "path": PATH,
        "queryStringParameters": {},
        "headers": {**hdrs, "host": f"fnserve-alb-1234567890.{REGION}.elb.amazonaws.com"},
        "body": body.decode(),
        "isBase64Encoded": False,
    }


def sqs_jobs(followups: bool = False) -> dict[str, Any]:
    """SQS event for the batch function: three digits-accurate jobs, one digits-fast job, one poison record.

    ``followups``: the follow-up function's event instead: jobs as a cascade sends them (ids
    minted by fnserve, the slow model, no digits-fast job).
    """
    bodies = []
    models = ["digits-accurate"] * 4 if followups else ["digits-accurate"] * 3 + ["digits-fast"]
    for i, model in enumerate(models):
        x = HOLDOUT["input"][i * 2 : i * 2 + 2]
        tensor = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        job_id = f"p-tfd9zk-{i:016x}-digits-0123456789abcdef0123" if followups else f"example-{i}"
        bodies.append(json.dumps({"id": job_id, "model": model, "inputs": [tensor]}, separators=(",", ":")))
    bodies.append('{"id": "example-poison", "model": "digits-accurate", "inputs": "not tensors"}')
    queue = "fnserve-followups" if followups else "fnserve-jobs"
    return sqs_event(bodies, queue=queue, id_prefix="059f36b4-87a3-44ab-83d2-66197573")


def text_body() -> bytes:
    texts = ["A warm container answers at once.", "Cold starts cost seconds."]
    request = {"id": "texts", "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts}]}
    return json.dumps(request, separators=(",", ":")).encode()


def image_body() -> tuple[bytes, int]:
    """examples/digit-7.png for the digits-image pipeline, unencoded (the binary extension's BYTES element)."""
    png = (REPO / "examples" / "digit-7.png").read_bytes()
    element = len(png).to_bytes(4, "little") + png
    tensor = {"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(element)}}
    head = json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode()
    return head + element, len(head)


def main() -> None:
    EVENTS.mkdir(exist_ok=True)
    body = json_body(slice(0, 4))
    binary, head = binary_body(slice(4, 8))
    bin_headers = headers(binary, "application/octet-stream", {"inference-header-content-length": str(head)})
    image, image_length = image_body()
    image_head = {"inference-header-content-length": str(image_length)}
    events = {
        "api-http-infer.json": http_api("POST", PATH, body, headers(body, "application/json")),
        "api-http-infer-binary.json": http_api("POST", PATH, binary, bin_headers, binary=True),
        "api-http-metadata.json": http_api("GET", f"/v2/models/{MODEL}", None, headers(b"", "application/json")),
        "api-http-embed.json": http_api(
            "POST", "/v2/models/minilm-embed/infer", text_body(), headers(text_body(), "application/json")
        ),
        "api-http-image.json": http_api(
            "POST", "/v2/models/digits-image/infer", image, headers(image, "application/octet-stream", image_head), True
        ),
        "batch-jobs.json": sqs_jobs(),
        "followup-jobs.json": sqs_jobs(followups=True),
    }
    others = {
        "api-rest-infer.json": rest_api(body, headers(body, "application/json")),
        "api-rest-infer-binary.json": rest_api(binary, bin_headers, binary=True),
        "api-alb-infer.json": alb(body, headers(body, "application/json")),
    }
    OTHER_EVENTS.mkdir(exist_ok=True)
    for folder, written in ((EVENTS, events), (OTHER_EVENTS, others)):
        for name, event in written.items():
            (folder / name).write_text(json.dumps(event, indent=2) + "\n")
            print(f"wrote {(folder / name).relative_to(REPO)}")


if __name__ == "__main__":
    main()
