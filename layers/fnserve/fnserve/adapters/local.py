"""`fnserve local`: run a SAM template's functions on a laptop, no Docker, with Lambda's concurrency model.

- AWS: an embedded moto server on 127.0.0.1 (or ``AWS_ENDPOINT_URL`` / LocalStack when set),
  holding the template's queues (with their redrive policies), tables and buckets.
- Functions: each in its own :class:`~fnserve.core.pool.WorkerPool` of warm workers, with the
  template's environment (references resolved to the local resources, ``/opt/...`` paths
  mapped to the layers' folders), timeout and memory.
- HTTP: a gateway turns each request into the API Gateway event its route declares (v2 for
  HTTP APIs, v1 for REST APIs) and the response back into HTTP.
- SQS: pollers long-poll each event source's queue, assemble batches (BatchSize, the
  batching window), invoke the function, and delete exactly the messages not reported in
  ``batchItemFailures``; the rest reappear after the visibility timeout and reach the DLQ
  after maxReceiveCount, as on AWS. A function error fails the whole batch.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from fnserve.adapters._template import Resolver, Template, load_template
from fnserve.adapters.logs import logger
from fnserve.aws import clients
from fnserve.core.errors import FnserveError
from fnserve.core.pool import FunctionSpec, WorkerPool

TEXT_TYPES = ("application/json", "text/", "application/xml", "application/x-www-form-urlencoded")


@dataclass
class HttpRoute:
    method: str
    path: str
    pattern: re.Pattern[str]
    version: str  # "2.0" (HTTP API) or "1.0" (REST API)
    function: str


@dataclass
class SqsSource:
    function: str
    queue_url: str
    queue_arn: str
    batch_size: int
    window: float
    report_failures: bool


@dataclass
class Local:
    """What the emulator runs, for the banner and for tests (GET /_fnserve/local)."""

    endpoint: str
    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    queues: dict[str, str] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)
    buckets: dict[str, str] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _path_pattern(path: str) -> re.Pattern[str]:
    regex = re.sub(r"\{(\w+)\+\}", r"(?P<\1>.+)", path)
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", regex)
    return re.compile(f"^{regex}$")


class Emulator:
    def __init__(
        self,
        template: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 3000,
        workers: int = 1,
        visibility_timeout: int | None = None,
        parameters: dict[str, str] | None = None,
    ) -> None:
        self.template: Template = load_template(template)
        self.root = template.resolve().parent
        self.host, self.port, self.workers = host, port, workers
        self.visibility_timeout = visibility_timeout
        self.parameters = parameters or {}
        self.pools: dict[str, WorkerPool] = {}
        self.routes: list[HttpRoute] = []
        self.sources: list[SqsSource] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._moto: Any = None
        self._server: Any = None
        self.local: Local | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Local:
        """Start everything; if any part cannot start (a function whose init fails, say), stop the rest."""
        try:
            endpoint = self._aws()
            physical, attributes = self._create_resources()
            resolver = Resolver(self.template, physical, attributes, self.parameters)
            self.local = Local(endpoint=endpoint)
            self._collect(resolver, physical)
            self._check_visibility()
            for name, spec in self.local.functions.items():
                self.pools[name] = WorkerPool(spec, self.workers).start()
            for source in self.sources:
                for n in range(self.workers):  # one poller per worker: batches run concurrently, as on AWS
                    self._thread(self._poll, source, name=f"sqs-{source.function}-{n}")
            self._serve()
        except BaseException:
            self.stop()
            raise
        return self.local

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        for thread in self._threads:
            thread.join(timeout=30)
        for pool in self.pools.values():
            pool.close()
        if self._moto is not None:
            self._moto.stop()

    def _thread(self, target: Any, *args: Any, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _check_visibility(self) -> None:
        """Warn where messages would reappear while their batch is still being gathered or run."""
        sqs = clients.client("sqs")
        assert self.local is not None
        for source in self.sources:
            attributes = sqs.get_queue_attributes(QueueUrl=source.queue_url, AttributeNames=["VisibilityTimeout"])
            visible_after = int(attributes["Attributes"]["VisibilityTimeout"])
            needed = source.window + self.local.functions[source.function].timeout
            if visible_after < needed:
                logger.warning(
                    "queue of %s: visibility timeout %ss is under the batching window plus the function timeout "
                    "(%gs): messages will reappear while their batch runs (AWS advises 6x the timeout + the window)",
                    source.function,
                    visible_after,
                    needed,
                )

    # -- AWS resources ----------------------------------------------------------------------------

    def _aws(self) -> str:
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(key, "local")
        endpoint = clients.endpoint_url("sqs")
        if endpoint is None:  # nothing configured: an embedded moto server, on loopback only
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per AWS call
            port = _free_port()
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            self._moto.start()
            endpoint = f"http://127.0.0.1:{port}"
            os.environ["AWS_ENDPOINT_URL"] = endpoint
        clients.reset()
        return endpoint

    def _create_resources(self) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
        physical: dict[str, str] = {}
        attributes: dict[tuple[str, str], str] = {}
        plain = Resolver(self.template, physical, attributes, self.parameters)
        sqs, dynamodb, s3 = clients.client("sqs"), clients.client("dynamodb"), clients.client("s3")
        queues = self.template.of_type("AWS::SQS::Queue")
        # Dead-letter queues first: a redrive policy names its DLQ's ARN.
        for name in sorted(queues, key=lambda n: "RedrivePolicy" in queues[n].get("Properties", {})):
            props = queues[name].get("Properties", {})
            attrs = {}
            timeout = self.visibility_timeout or props.get("VisibilityTimeout")
            if timeout is not None:
                attrs["VisibilityTimeout"] = str(plain.resolve(timeout))
            if "RedrivePolicy" in props:
                redrive = plain.resolve(props["RedrivePolicy"])
                attrs["RedrivePolicy"] = json.dumps(
                    {
                        "deadLetterTargetArn": redrive["deadLetterTargetArn"],
                        "maxReceiveCount": str(redrive["maxReceiveCount"]),
                    }
                )
            url = sqs.create_queue(QueueName=f"fnserve-local-{name}", Attributes=attrs)["QueueUrl"]
            physical[name] = url
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            attributes[(name, "Arn")] = arn
            attributes[(name, "QueueName")] = url.rsplit("/", 1)[-1]
        for name, resource in self.template.of_type("AWS::DynamoDB::Table").items():
            props = plain.resolve(resource.get("Properties", {}))
            table = f"fnserve-local-{name}"
            dynamodb.create_table(
                TableName=table,
                KeySchema=props["KeySchema"],
                AttributeDefinitions=props["AttributeDefinitions"],
                BillingMode="PAY_PER_REQUEST",
            )
            ttl = props.get("TimeToLiveSpecification")
            if ttl and ttl.get("Enabled"):
                dynamodb.update_time_to_live(TableName=table, TimeToLiveSpecification=ttl)
            physical[name] = table
            attributes[(name, "Arn")] = f"arn:aws:dynamodb:us-east-1:123456789012:table/{table}"
        for name in self.template.of_type("AWS::S3::Bucket"):
            bucket = f"fnserve-local-{name.lower()}"
            s3.create_bucket(Bucket=bucket)
            physical[name] = bucket
            attributes[(name, "Arn")] = f"arn:aws:s3:::{bucket}"
        return physical, attributes

    # -- functions, routes, event sources ---------------------------------------------------------

    def _collect(self, resolver: Resolver, physical: dict[str, str]) -> None:
        assert self.local is not None
        defaults = resolver.resolve(self.template.globals.get("Function", {}))
        layers = {
            name: self.root / r["Properties"]["ContentUri"]
            for name, r in self.template.of_type("AWS::Serverless::LayerVersion").items()
        }
        for name, resource in self.template.of_type("AWS::Serverless::Function").items():
            props = {**defaults, **resolver.resolve(resource.get("Properties", {}))}
            env = {**defaults.get("Environment", {}).get("Variables", {})}
            env |= props.get("Environment", {}).get("Variables", {})
            roots = [layers[layer] for layer in props.get("Layers", []) if layer in layers]
            env = {k: self._opt(str(v), roots) for k, v in env.items()}
            env |= {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
            env["FNSERVE_PARALLEL_WORKERS"] = str(self.workers)
            self.local.functions[name] = FunctionSpec(
                name=name,
                code_dir=str(self.root / props.get("CodeUri", ".")),
                handler=props.get("Handler", "app.handler"),
                env=env,
                timeout=float(props.get("Timeout", 3)),
                memory_mb=int(props.get("MemorySize", 128)),
            )
            for event in (props.get("Events") or {}).values():
                self._event(name, event, resolver)
        self._raw_http_routes(resolver)
        queues = self.template.of_type("AWS::SQS::Queue")
        self.local.queues = {name: physical[name] for name in queues}
        self.local.tables = {n: physical[n] for n in self.template.of_type("AWS::DynamoDB::Table")}
        self.local.buckets = {n: physical[n] for n in self.template.of_type("AWS::S3::Bucket")}

    @staticmethod
    def _opt(value: str, layers: list[Path]) -> str:
        # In Lambda a layer's content lands under /opt; here it stays in its folder.
        if value.startswith("/opt/"):
            for root in layers:
                candidate = root / value.removeprefix("/opt/")
                if candidate.exists():
                    return str(candidate)
        return value

    def _event(self, function: str, event: dict[str, Any], resolver: Resolver) -> None:
        props = event.get("Properties", {})
        kind = event.get("Type")
        if kind in ("HttpApi", "Api"):
            method = str(props.get("Method", "ANY")).upper()
            path = props.get("Path", "/{proxy+}")
            version = "2.0" if kind == "HttpApi" else "1.0"
            self.routes.append(HttpRoute(method, path, _path_pattern(path), version, function))
        elif kind == "SQS":
            arn = props["Queue"]
            by_arn = {
                a: resolver.physical[n] for (n, attribute), a in resolver.attributes.items() if attribute == "Arn"
            }
            url = by_arn.get(arn)
            if url is None:
                raise ValueError(f"function {function}: queue {arn} is not declared in the template")
            self.sources.append(
                SqsSource(
                    function,
                    url,
                    arn,
                    int(props.get("BatchSize", 10)),
                    float(props.get("MaximumBatchingWindowInSeconds", 0)),
                    "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
                )
            )

    def _raw_http_routes(self, resolver: Resolver) -> None:
        """AWS::ApiGatewayV2 routes with AWS_PROXY integrations (HTTP APIs declared without SAM events)."""
        integrations = {}
        for name, resource in self.template.of_type("AWS::ApiGatewayV2::Integration").items():
            uri = resource["Properties"].get("IntegrationUri", {})
            target = uri.get("Ref", "") if isinstance(uri, dict) else str(uri)
            function = target.split(".")[0]
            if function in self.template.resources:
                version = str(resource["Properties"].get("PayloadFormatVersion", "2.0"))
                integrations[name] = (function, version)
        for resource in self.template.of_type("AWS::ApiGatewayV2::Route").values():
            props = resolver.resolve(resource["Properties"])
            target = str(props.get("Target", "")).removeprefix("integrations/")
            if target not in integrations:
                continue
            method, _, path = str(props["RouteKey"]).partition(" ")
            function, version = integrations[target]
            self.routes.append(HttpRoute(method.upper(), path, _path_pattern(path), version, function))

    # -- HTTP gateway -----------------------------------------------------------------------------

    def _serve(self) -> None:
        import uvicorn

        app = Starlette(
            routes=[
                StarletteRoute("/_fnserve/local", self._info, methods=["GET"]),
                StarletteRoute(
                    "/{path:path}", self._gateway, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
                ),
            ]
        )
        config = uvicorn.Config(
            app, host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread(self._server.run, name="gateway")
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._threads[-1].is_alive():
                raise RuntimeError(f"the gateway could not listen on {self.host}:{self.port}")
            time.sleep(0.02)

    async def _info(self, request: Request) -> Response:
        assert self.local is not None
        return JSONResponse(
            {
                "endpoint": self.local.endpoint,
                "queues": self.local.queues,
                "tables": self.local.tables,
                "buckets": self.local.buckets,
                "functions": {name: pool.worker_pids() for name, pool in self.pools.items()},
                "routes": [f"{r.method} {r.path} -> {r.function} ({r.version})" for r in self.routes],
            }
        )

    async def _gateway(self, request: Request) -> Response:
        path = request.url.path
        for route in self.routes:
            match = route.pattern.match(path)
            if match and route.method in ("ANY", request.method):
                break
        else:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        body = await request.body()
        build = _http_api_event if route.version == "2.0" else _rest_api_event
        event = build(request, route, match.groupdict(), body)
        try:
            response = await asyncio.wrap_future(self.pools[route.function].invoke(event))
        except FnserveError as exc:
            # API Gateway's own answers when the integration fails: 502, or 503/504.
            status = exc.status_code if exc.status_code in (503, 504) else 502
            return JSONResponse({"message": exc.message}, status_code=status)
        return _http_response(response)

    # -- SQS event sources ------------------------------------------------------------------------

    def _poll(self, source: SqsSource) -> None:
        sqs = clients.client("sqs")
        pool = self.pools[source.function]
        while not self._stop.is_set():
            batch = list(self._batch(sqs, source))
            if not batch:
                continue
            try:
                result = pool.invoke(_sqs_event(batch, source)).result()
            except Exception as exc:  # a function error fails the whole batch: nothing is deleted
                logger.warning("function %s failed its batch of %d: %s", source.function, len(batch), exc)
                continue
            failed = set()
            if source.report_failures and isinstance(result, dict):
                failed = {f.get("itemIdentifier") for f in result.get("batchItemFailures") or []}
            done = [m for m in batch if m["MessageId"] not in failed]
            for start in range(0, len(done), 10):
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done[start : start + 10])
                ]
                sqs.delete_message_batch(QueueUrl=source.queue_url, Entries=entries)

    def _batch(self, sqs: Any, source: SqsSource) -> Iterator[dict[str, Any]]:
        """One batch: up to BatchSize messages, gathered for at most the batching window."""
        got = 0
        first = None
        while got < source.batch_size and not self._stop.is_set():
            left = source.window - (time.monotonic() - first) if first is not None else 1.0
            if first is not None and left <= 0:
                return
            response = sqs.receive_message(
                QueueUrl=source.queue_url,
                MaxNumberOfMessages=min(10, source.batch_size - got),
                WaitTimeSeconds=max(0, min(1, int(left))),
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            messages = response.get("Messages", [])
            yield from messages
            got += len(messages)
            if messages and first is None:
                first = time.monotonic()
            if first is None and not messages:
                return  # nothing waiting: go round (and notice a stop)
            if source.window == 0 and first is not None:
                return


def _sqs_event(messages: list[dict[str, Any]], source: SqsSource) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": m.get("MessageAttributes", {}),
                "md5OfBody": m.get("MD5OfBody") or hashlib.md5(m["Body"].encode()).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": source.queue_arn,
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


def _body(request: Request, body: bytes) -> tuple[str | None, bool]:
    if not body:
        return None, False
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(TEXT_TYPES) or not content_type:
        try:
            return body.decode(), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode(), True


def _http_api_event(request: Request, route: HttpRoute, params: dict[str, str], body: bytes) -> dict[str, Any]:
    text, encoded = _body(request, body)
    now = time.time()
    route_key = f"{route.method} {route.path}"
    return {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": request.url.path,
        "rawQueryString": request.url.query,
        "headers": {k: v for k, v in request.headers.items()},
        "queryStringParameters": dict(request.query_params) or None,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "local",
            "domainName": request.url.hostname or "localhost",
            "domainPrefix": "local",
            "http": {
                "method": request.method,
                "path": request.url.path,
                "protocol": "HTTP/1.1",
                "sourceIp": request.client.host if request.client else "127.0.0.1",
                "userAgent": request.headers.get("user-agent", ""),
            },
            "requestId": uuid.uuid4().hex,
            "routeKey": route_key,
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "pathParameters": params or None,
        "body": text,
        "isBase64Encoded": encoded,
    }


def _rest_api_event(request: Request, route: HttpRoute, params: dict[str, str], body: bytes) -> dict[str, Any]:
    text, encoded = _body(request, body)
    headers = {k: v for k, v in request.headers.items()}
    query = dict(request.query_params) or None
    return {
        "resource": route.path,
        "path": request.url.path,
        "httpMethod": request.method,
        "headers": headers,
        "multiValueHeaders": {k: request.headers.getlist(k) for k in headers},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: request.query_params.getlist(k) for k in query} if query else None,
        "pathParameters": params or None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": route.path,
            "httpMethod": request.method,
            "path": request.url.path,
            "stage": "local",
            "requestId": uuid.uuid4().hex,
            "identity": {"sourceIp": request.client.host if request.client else "127.0.0.1"},
            "accountId": "123456789012",
            "apiId": "local",
        },
        "body": text,
        "isBase64Encoded": encoded,
    }


def _http_response(response: Any) -> Response:
    if not isinstance(response, dict) or "statusCode" not in response:
        return JSONResponse({"message": "Internal Server Error"}, status_code=502)
    body = response.get("body") or ""
    content = base64.b64decode(body) if response.get("isBase64Encoded") else str(body).encode()
    headers = {k: str(v) for k, v in (response.get("headers") or {}).items()}
    for key, values in (response.get("multiValueHeaders") or {}).items():
        headers[key] = ", ".join(str(v) for v in values)
    headers.pop("content-length", None)
    return Response(content, status_code=int(response["statusCode"]), headers=headers)
