"""AWS's published on-demand prices (us-east-1, USD, free tiers left out) that ``fnserve bench --lambda`` costs
memory sizes at, and that docs/aws-costs.md's cost figures are made from, with the other serverless targets' beside them
(SageMaker Serverless Inference; Cloud Run in a tier 1 region): a test keeps the page equal to them.

When AWS changes a price, change it here with the date it was read (``AS_OF``); ``python -m
tests.unit.test_aws_page`` prints what the page should then say, and the tests fail until it does. For one run,
``fnserve bench --price-gb-second ... --price-per-million ...`` overrides Lambda's two prices (another region,
arm64, a discount).
"""

from __future__ import annotations

import math

AS_OF = "2026-11-28"
SOURCE = "https://aws.amazon.com/pricing/"  # each service's page below it: /lambda/pricing/, /sqs/pricing/, ...

LAMBDA_PER_MILLION = 0.20
LAMBDA_GB_SECOND = {"x86_64": 0.0000166667, "arm64": 0.0000133334}  # the first 6 (arm64 7.5) billion GB-s a month
LAMBDA_PROVISIONED_GB_SECOND = {"x86_64": 0.0000041667, "arm64": 0.0000033334}  # configured, used or not
HTTP_API_PER_MILLION = 1.00  # the first 300 million a month; metered in 512 KB steps
REST_API_PER_MILLION = 3.50  # the first 333 million a month
ALB_HOUR = 0.0225  # an Application Load Balancer's every hour
ALB_LCU_HOUR = 0.008  # its capacity units: the most used of new connections, active ones, bytes, rule evaluations
SQS_PER_MILLION = 0.40
DYNAMODB_WRITES_PER_MILLION = 0.625
DYNAMODB_READS_PER_MILLION = 0.125
DYNAMODB_GB_MONTH = 0.25
DYNAMODB_BACKUP_GB_MONTH = 0.20  # point-in-time recovery, which the results table has on
S3_GB_MONTH = 0.023
ECR_GB_MONTH = 0.10
LOGS_INGESTED_GB = 0.50
LOGS_STORED_GB_MONTH = 0.03
CUSTOM_METRIC_MONTH = 0.30
ALARM_METRIC_MONTH = 0.10  # a metric-math alarm counts each metric it reads
SECRET_MONTH = 0.40
XRAY_PER_MILLION_TRACES = 5.00
SAGEMAKER_SERVERLESS_GB_SECOND = 0.0000200  # the memory size chosen, for each request's compute time
SAGEMAKER_SERVERLESS_DATA_GB = 0.016  # data processed, in and out
CLOUD_RUN_SOURCE = "https://cloud.google.com/run/pricing"
CLOUD_RUN_VCPU_SECOND = 0.0000240  # request-based billing: while an instance has a request in flight
CLOUD_RUN_GIB_SECOND = 0.0000025
CLOUD_RUN_PER_MILLION = 0.40
CLOUD_RUN_ROUNDING_MS = 100  # an instance's billable time is rounded up to this
GOOGLE_API_GATEWAY_SOURCE = "https://cloud.google.com/api-gateway/pricing"
GOOGLE_API_GATEWAY_PER_MILLION = 3.00  # past the first 2 million calls a month, up to a billion

TABLE = (  # (what, price, per what): docs/aws-costs.md's price table, row by row
    ("Lambda requests", LAMBDA_PER_MILLION, "million invocations"),
    ("Lambda duration, x86_64", LAMBDA_GB_SECOND["x86_64"], "GB-second"),
    ("Lambda duration, arm64", LAMBDA_GB_SECOND["arm64"], "GB-second"),
    ("Provisioned concurrency, x86_64", LAMBDA_PROVISIONED_GB_SECOND["x86_64"], "GB-second configured"),
    ("Provisioned concurrency, arm64", LAMBDA_PROVISIONED_GB_SECOND["arm64"], "GB-second configured"),
    ("HTTP API requests", HTTP_API_PER_MILLION, "million requests"),
    ("REST API requests", REST_API_PER_MILLION, "million requests"),
    ("Application Load Balancer", ALB_HOUR, "hour"),
    ("Application Load Balancer capacity", ALB_LCU_HOUR, "LCU-hour"),
    ("SQS requests", SQS_PER_MILLION, "million requests (64 KB each)"),
    ("DynamoDB writes, on demand", DYNAMODB_WRITES_PER_MILLION, "million write units (1 KB each)"),
    ("DynamoDB reads, on demand", DYNAMODB_READS_PER_MILLION, "million read units (4 KB each)"),
    ("DynamoDB storage", DYNAMODB_GB_MONTH, "GB-month"),
    ("DynamoDB point-in-time recovery", DYNAMODB_BACKUP_GB_MONTH, "GB-month"),
    ("S3 storage", S3_GB_MONTH, "GB-month"),
    ("ECR storage", ECR_GB_MONTH, "GB-month"),
    ("CloudWatch Logs ingestion", LOGS_INGESTED_GB, "GB"),
    ("CloudWatch Logs storage", LOGS_STORED_GB_MONTH, "GB-month"),
    ("CloudWatch custom metrics", CUSTOM_METRIC_MONTH, "metric-month"),
    ("CloudWatch alarms", ALARM_METRIC_MONTH, "alarm metric-month"),
    ("Secrets Manager", SECRET_MONTH, "secret-month"),
    ("X-Ray traces recorded", XRAY_PER_MILLION_TRACES, "million traces"),
    ("SageMaker Serverless Inference", SAGEMAKER_SERVERLESS_GB_SECOND, "GB-second of memory size computing"),
    ("SageMaker Serverless data processed", SAGEMAKER_SERVERLESS_DATA_GB, "GB in or out"),
    ("Cloud Run CPU (tier 1 region)", CLOUD_RUN_VCPU_SECOND, "vCPU-second with a request in flight"),
    ("Cloud Run memory (tier 1 region)", CLOUD_RUN_GIB_SECOND, "GiB-second with a request in flight"),
    ("Cloud Run requests", CLOUD_RUN_PER_MILLION, "million requests"),
    ("Google Cloud API Gateway calls", GOOGLE_API_GATEWAY_PER_MILLION, "million calls"),
)


def lambda_cost_per_million(
    memory_mb: int,
    billed_ms: float,
    *,
    gb_second: float = LAMBDA_GB_SECOND["x86_64"],
    per_million: float = LAMBDA_PER_MILLION,
) -> float:
    """What a million invocations of a ``memory_mb`` function billed ``billed_ms`` each cost: requests and duration."""
    return per_million + 1e6 * billed_ms / 1e3 * memory_mb / 1024 * gb_second


def sagemaker_serverless_cost_per_million(memory_mb: int, billed_ms: float) -> float:
    """What a million invocations of a Serverless Inference endpoint of ``memory_mb`` cost, each computing
    ``billed_ms``: the compute alone (data processed is by the GB, apart)."""
    return 1e6 * billed_ms / 1e3 * memory_mb / 1024 * SAGEMAKER_SERVERLESS_GB_SECOND


def cloud_run_cost_per_million(vcpus: float, memory_gib: float, instance_ms: float, *, alone: bool) -> float:
    """What a million requests to a Cloud Run service cost with request-based billing, each keeping an instance of
    ``vcpus`` and ``memory_gib`` busy ``instance_ms``: ``alone``, each the only request in flight, its time rounded
    up to the billing step; otherwise under steady load, the instance never idle between requests (its time then
    shared: ``instance_ms`` is a request's share, its CPU time over the instance's vCPUs for a CPU-bound model)."""
    if alone:
        instance_ms = math.ceil(instance_ms / CLOUD_RUN_ROUNDING_MS) * CLOUD_RUN_ROUNDING_MS
    per_second = vcpus * CLOUD_RUN_VCPU_SECOND + memory_gib * CLOUD_RUN_GIB_SECOND
    return CLOUD_RUN_PER_MILLION + 1e6 * instance_ms / 1e3 * per_second


# -- a request's whole bill: what else an API request is billed by, around Lambda ------------------------------------
# docs/aws-costs.md's worked totals. tests/functional/test_request_bytes.py measures the bytes below on the real
# handler and fails when they drift; tests/unit/test_aws_page.py checks template.yaml still deploys what they assume.

MONTH_SECONDS = 730 * 3600  # the month AWS's and Google's pricing pages multiply by (the targets' month too)
GB = 1024**3  # a GB on AWS's bills
TRAFFIC = (1, 100)  # the steady requests a second the worked totals are at
API_MEMORY_MB = 2048  # template.yaml's ApiMemorySize default, at which LAMBDA_BILLED_MS holds
POLLED_QUEUES = 2  # template.yaml's queues with a function's SQS event source: the jobs and the follow-ups
REQUESTS = {"digits-accurate": "one digit", "minilm-embed": "one sentence"}  # the demo stack's models, and a request
LAMBDA_BILLED_MS = {  # a warm request's mean billed milliseconds at API_MEMORY_MB, as the bench machine measures by
    # fnserve bench layers/models/models/manifest.toml --model MODEL --no-sweep --lambda --memory 2048
    "digits-accurate": 1.01,
    "minilm-embed": 6.06,
}
FUNCTION_LOG_BYTES = {  # the API function's lines a request: its access line and its EMF metrics
    "digits-accurate": 1110,
    "minilm-embed": 1256,
}
HTTP_API_LOG_BYTES = 196  # the stage's access-log line: template.yaml's AccessLogSettings Format, filled in
CACHE_ITEM_BYTES = {"digits-accurate": 207, "minilm-embed": 1670}  # a cached result's DynamoDB item (cache_ttl_seconds)
XRAY_RESERVOIR_PER_SECOND = 1  # X-Ray's default sampling rule, which Lambda's active tracing applies: the first
XRAY_FIXED_RATE = 0.05  # request each second, then this share of the rest
SQS_IDLE_POLLERS = 5  # Lambda polls an SQS event source with five long polls at once while it has nothing to read
SQS_WAIT_SECONDS = 20  # each a ReceiveMessage request that waits 20 s for a message
DYNAMODB_READ_UNIT_BYTES = 4096  # on demand: half a read unit for an eventually consistent read of up to 4 KB
DYNAMODB_WRITE_UNIT_BYTES = 1024  # a write unit a KB written


def logs_cost_per_million(bytes_per_request: float) -> float:
    """CloudWatch Logs' ingestion of a million requests that each write ``bytes_per_request`` of log lines."""
    return 1e6 * bytes_per_request / GB * LOGS_INGESTED_GB


def xray_sampled_share(requests_per_second: float) -> float:
    """The share of requests X-Ray records at a steady rate under its default rule: the reservoir's one a second,
    then its fixed rate of the rest."""
    reservoir = min(requests_per_second, XRAY_RESERVOIR_PER_SECOND)
    return (reservoir + XRAY_FIXED_RATE * (requests_per_second - reservoir)) / requests_per_second


def xray_cost_per_million(requests_per_second: float) -> float:
    """X-Ray's traces recorded of a million requests at a steady rate (``XRayTracing=Active``)."""
    return xray_sampled_share(requests_per_second) * XRAY_PER_MILLION_TRACES


def sqs_idle_requests_a_month(queues: int) -> float:
    """The ReceiveMessage requests Lambda's pollers make in a month on ``queues`` queues with nothing in them."""
    return queues * SQS_IDLE_POLLERS * MONTH_SECONDS / SQS_WAIT_SECONDS


def sqs_idle_cost_a_month(queues: int) -> float:
    """What those requests cost: SQS bills an empty receive as any other request."""
    return sqs_idle_requests_a_month(queues) / 1e6 * SQS_PER_MILLION


def per_million_requests(monthly_usd: float, requests_per_second: float) -> float:
    """A fixed monthly cost's share of a million requests, at a steady rate all month."""
    return monthly_usd / (requests_per_second * MONTH_SECONDS) * 1e6


def dynamodb_cache_cost_per_million(item_bytes: int, hit_share: float = 0.0) -> float:
    """The result cache's DynamoDB bill for a million requests to a model with ``cache_ttl_seconds``, a cached result
    ``item_bytes`` long: each request one eventually consistent read (BatchGetItem; a miss still costs half a read
    unit), each miss one write of the item."""
    hit_units = 0.5 * math.ceil(item_bytes / DYNAMODB_READ_UNIT_BYTES)
    reads = hit_share * hit_units + (1 - hit_share) * 0.5
    writes = (1 - hit_share) * math.ceil(item_bytes / DYNAMODB_WRITE_UNIT_BYTES)
    return reads * DYNAMODB_READS_PER_MILLION + writes * DYNAMODB_WRITES_PER_MILLION


def request_costs(model: str, requests_per_second: float) -> dict[str, float]:
    """A million API requests to one of the demo stack's models at a steady rate, by what bills them, as template.yaml
    deploys the stack by default (x86_64, X-Ray active, Lambda's own START and REPORT lines filtered out)."""
    return {
        "Lambda requests": LAMBDA_PER_MILLION,
        f"Lambda duration, {API_MEMORY_MB} MB": lambda_cost_per_million(
            API_MEMORY_MB, LAMBDA_BILLED_MS[model], per_million=0.0
        ),
        "HTTP API requests": HTTP_API_PER_MILLION,
        "CloudWatch Logs ingestion": logs_cost_per_million(FUNCTION_LOG_BYTES[model] + HTTP_API_LOG_BYTES),
        "X-Ray traces recorded": xray_cost_per_million(requests_per_second),
        f"SQS polling of {POLLED_QUEUES} idle queues": per_million_requests(
            sqs_idle_cost_a_month(POLLED_QUEUES), requests_per_second
        ),
    }


def request_figures_table() -> str:
    """docs/aws-costs.md's table of what each demo model's request is billed on: its milliseconds, its log bytes and
    the item its cached result would be."""
    lines = [
        f"| model, a request | billed ms at {API_MEMORY_MB} MB | log bytes: the function's + the HTTP API's "
        "| a cached result's item |",
        "| --- | --- | --- | --- |",
    ]
    for model, request in REQUESTS.items():
        item = CACHE_ITEM_BYTES[model]
        units = math.ceil(item / DYNAMODB_WRITE_UNIT_BYTES)
        lines.append(
            f"| {model}, {request} | {LAMBDA_BILLED_MS[model]:g} | {FUNCTION_LOG_BYTES[model]:,} + "
            f"{HTTP_API_LOG_BYTES:,} | {item:,} bytes: {units} write unit{'s' if units > 1 else ''} |"
        )
    return "\n".join(lines)


def worked_totals_table() -> str:
    """docs/aws-costs.md's worked totals: a million requests to each demo model at each rate in ``TRAFFIC``, by
    service, then the result cache's DynamoDB apart (only a model with ``cache_ttl_seconds`` has it; the demo's do
    not), every request a miss."""
    columns = [(model, rate) for model in REQUESTS for rate in TRAFFIC]
    costs = [request_costs(model, rate) for model, rate in columns]
    head = ["a million requests", *(f"{model} at {rate}/s" for model, rate in columns)]
    rows = [[what, *(f"${cost[what]:.3f}" for cost in costs)] for what in costs[0]]
    rows.append(["**total**", *(f"**${sum(cost.values()):.3f}**" for cost in costs)])
    cache = [dynamodb_cache_cost_per_million(CACHE_ITEM_BYTES[model]) for model, _ in columns]
    rows.append(["DynamoDB result cache, every request a miss", *(f"${usd:.3f}" for usd in cache)])
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


# -- fnserve bench --targets: what its other targets bill (read on AS_OF, as the rest) ---------------------------------

LAMBDA_PROVISIONED_DURATION_GB_SECOND = {"x86_64": 0.0000097222, "arm64": 0.0000077778}  # a request's time on one
CLOUD_RUN_IDLE_VCPU_SECOND = 0.0000025  # request-based billing: a minimum instance idle
CLOUD_RUN_IDLE_GIB_SECOND = 0.0000025
CLOUD_RUN_INSTANCE_VCPU_SECOND = 0.0000180  # instance-based billing: an instance's whole life, no per-request fee
CLOUD_RUN_INSTANCE_GIB_SECOND = 0.0000020
FARGATE_SOURCE = "https://aws.amazon.com/fargate/pricing/"  # Linux, us-east-1, on demand
FARGATE_VCPU_HOUR = {"x86_64": 0.04048, "arm64": 0.03238}
FARGATE_GB_HOUR = {"x86_64": 0.004445, "arm64": 0.00356}
