"""Lambda's side of the wire, as AWS delivers it: events, the context object, and the fake identities.

The one builder of these shapes, shared by the emulator (gateway, SQS pollers, pool workers),
the tests and ``infra/events/make_events.py``. Pure Python: importing it loads nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

# The one table of fake identities: every ARN, account id and region made locally uses these.
REGION = "us-east-1"
ACCOUNT_ID = "123456789012"


def arn(service: str, resource: str) -> str:
    """An ARN in the fake account and region (S3 ARNs name neither, as on AWS)."""
    if service == "s3":
        return f"arn:aws:s3:::{resource}"
    return f"arn:aws:{service}:{REGION}:{ACCOUNT_ID}:{resource}"


class LambdaContext:
    """The attributes of Lambda's context object that handlers and Powertools read."""

    def __init__(
        self,
        request_id: str | None = None,
        function_name: str = "fnserve-api",
        memory_mb: int = 2048,
        timeout: float = 30.0,
    ) -> None:
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.invoked_function_arn = arn("lambda", f"function:{function_name}")
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}"
        self._deadline = time.monotonic() + timeout

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


# -- SQS --------------------------------------------------------------------------------------


def scheduled_event(rule: str, when: float | None = None) -> dict[str, Any]:
    """What an EventBridge scheduled rule sends its target (a "Scheduled Event"), at ``when`` (epoch seconds)."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT_ID,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
        "region": REGION,
        "resources": [arn("events", f"rule/{rule}")],
        "detail": {},
    }


def sqs_record(
    body: str,
    *,
    message_id: str,
    receipt_handle: str,
    queue: str,
    attributes: Mapping[str, str] | None = None,
    message_attributes: Mapping[str, Any] | None = None,
    md5: str | None = None,
) -> dict[str, Any]:
    """One record of an SQS event, as Lambda's event source mapping delivers it."""
    return {
        "messageId": message_id,
        "receiptHandle": receipt_handle,
        "body": body,
        "attributes": dict(attributes or {}),
        "messageAttributes": dict(message_attributes or {}),
        "md5OfBody": md5 or hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": arn("sqs", queue),
        "awsRegion": REGION,
    }


def sqs_event(
    bodies: Sequence[str],
    receive_counts: Sequence[int] | None = None,
    queue: str = "fnserve-jobs",
    id_prefix: str = "msg-0",
) -> dict[str, Any]:
    """An SQS event of one record per body (message ids ``{id_prefix}0000``, ``{id_prefix}0001``, ...)."""
    counts = receive_counts or [1] * len(bodies)
    return {
        "Records": [
            sqs_record(
                body,
                message_id=f"{id_prefix}{i:04d}",
                receipt_handle=f"AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a{i:04d}",
                queue=queue,
                attributes={
                    "ApproximateReceiveCount": str(count),
                    "SentTimestamp": "1795321200000",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1795321200001",
                },
            )
            for i, (body, count) in enumerate(zip(bodies, counts, strict=True))
        ]
    }


def sqs_event_of_messages(messages: Sequence[Mapping[str, Any]], queue: str) -> dict[str, Any]:
    """The SQS event for messages as ReceiveMessage returned them (the emulator's pollers)."""
    return {
        "Records": [
            sqs_record(
                m["Body"],
                message_id=m["MessageId"],
                receipt_handle=m["ReceiptHandle"],
                queue=queue,
                attributes=m.get("Attributes"),
                message_attributes=m.get("MessageAttributes"),
                md5=m.get("MD5OfBody"),
            )
            for m in messages
        ]
    }


# -- API Gateway ------------------------------------------------------------------------------


def _body(body: bytes | None, binary: bool) -> str | None:
    if body is None:
        return None
    return base64.b64encode(body).decode() if binary else body.decode()


def http_api_event(
    method: str,
    path: str,
    *,
    route_key: str,
    headers: Mapping[str, str],
    body: bytes | None = None,
    binary: bool = False,
    query: str = "",
    path_parameters: Mapping[str, str] | None = None,
    source_ip: str = "127.0.0.1",
    api_id: str = "local",
    domain: str = "localhost",
    request_id: str | None = None,
    epoch_ms: int | None = None,
    authorizer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An API Gateway HTTP API event (payload format 2.0); ``binary`` bodies are base64-encoded."""
    epoch_ms = int(time.time() * 1000) if epoch_ms is None else epoch_ms
    context: dict[str, Any] = {"accountId": ACCOUNT_ID, "apiId": api_id}
    if authorizer is not None:
        context["authorizer"] = dict(authorizer)
    context |= {
        "domainName": domain,
        "domainPrefix": domain.split(".")[0],
        "http": {
            "method": method,
            "path": path,
            "protocol": "HTTP/1.1",
            "sourceIp": source_ip,
            "userAgent": headers.get("user-agent", ""),
        },
        "requestId": request_id or uuid.uuid4().hex,
        "routeKey": route_key,
        "stage": "$default",
        "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(epoch_ms / 1000)),
        "timeEpoch": epoch_ms,
    }
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": query,
        "headers": dict(headers),
    }
    if query:
        event["queryStringParameters"] = _query(query, multi=False)
    event |= {
        "requestContext": context,
        "pathParameters": dict(path_parameters) if path_parameters else None,
        "isBase64Encoded": binary,
        "stageVariables": None,
    }
    if body is not None:
        event["body"] = _body(body, binary)
    return event


def authorizer_event(request: Mapping[str, Any], identity: Sequence[str]) -> dict[str, Any]:
    """What an HTTP API's Lambda authorizer (payload format 2.0) gets for the HTTP API event ``request``: the
    request without its body, its route's ARN, and the values of the authorizer's identity sources."""
    context = request["requestContext"]
    method, path = context["http"]["method"], context["http"]["path"]
    route_arn = f"{arn('execute-api', context['apiId'])}/{context['stage']}/{method}{path}"
    event = {"version": "2.0", "type": "REQUEST", "routeArn": route_arn, "identitySource": list(identity)}
    event |= {k: v for k, v in request.items() if k not in ("version", "body", "isBase64Encoded")}
    return event


def rest_api_event(
    method: str,
    path: str,
    *,
    resource: str,
    headers: Mapping[str, Sequence[str]],
    body: bytes | None = None,
    binary: bool = False,
    query: str = "",
    path_parameters: Mapping[str, str] | None = None,
    stage: str = "local",
    source_ip: str = "127.0.0.1",
    api_id: str = "local",
    request_id: str | None = None,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST API event (Lambda proxy integration, payload format 1.0).

    ``headers`` maps each name to its values; ``context`` adds to (or replaces) the request context.
    """
    request_context = {
        "resourcePath": resource,
        "httpMethod": method,
        "path": f"/{stage}{path}",
        "accountId": ACCOUNT_ID,
        "stage": stage,
        "requestId": request_id or str(uuid.uuid4()),
        "identity": {"sourceIp": source_ip},
        "apiId": api_id,
        **(context or {}),
    }
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": {name: values[-1] for name, values in headers.items()},
        "multiValueHeaders": {name: list(values) for name, values in headers.items()},
        "queryStringParameters": _query(query, multi=False) if query else None,
        "multiValueQueryStringParameters": _query(query, multi=True) if query else None,
        "pathParameters": dict(path_parameters) if path_parameters else None,
        "stageVariables": None,
        "requestContext": request_context,
        "body": _body(body, binary),
        "isBase64Encoded": binary,
    }


def _query(query: str, *, multi: bool) -> dict[str, Any]:
    from urllib.parse import parse_qsl

    pairs = parse_qsl(query, keep_blank_values=True)
    if not multi:
        return dict(pairs)
    out: dict[str, list[str]] = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out
