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

TABLE = (  # (what, price, per what): docs/aws-costs.md's price table, row by row
    ("Lambda requests", LAMBDA_PER_MILLION, "million invocations"),
    ("Lambda duration, x86_64", LAMBDA_GB_SECOND["x86_64"], "GB-second"),
    ("Lambda duration, arm64", LAMBDA_GB_SECOND["arm64"], "GB-second"),
    ("Provisioned concurrency, x86_64", LAMBDA_PROVISIONED_GB_SECOND["x86_64"], "GB-second configured"),
    ("Provisioned concurrency, arm64", LAMBDA_PROVISIONED_GB_SECOND["arm64"], "GB-second configured"),
    ("HTTP API requests", HTTP_API_PER_MILLION, "million requests"),
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
