"""Environment settings (``FNSERVE_*`` variables), one class per concern.

Each part of fnserve takes the narrowest class it needs (the HTTP app :class:`HttpSettings`,
the result store :class:`AwsSettings`, ...); the composition root reads :class:`Settings`,
which is all of them, once per process. What one model does is the manifest's business
(:mod:`fnserve.core.manifest`), not the environment's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from fnserve.core._cpus import available_cpus

_PREFIX = "FNSERVE_"
WHOLE = "FNSERVE_SETTINGS"  # every setting of a parent process (a server's), as JSON: see EnvSettings.to_env


class EnvSettings(BaseModel):
    """Settings read from ``FNSERVE_<FIELD>`` variables (names case-insensitive); values given to the
    constructor take precedence, and either counts as set (``model_fields_set``).

    pydantic-settings' ``BaseSettings``, on plain pydantic: every setting is a scalar that pydantic
    parses from its string, and importing pydantic-settings (its cloud secret sources, dotenv, asyncio)
    would weigh on every Lambda cold start (docs/design/start.md).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    def __init__(self, **values: Any) -> None:
        environ = {key.upper(): value for key, value in os.environ.items() if key.upper().startswith(_PREFIX)}
        whole = orjson.loads(environ[WHOLE]) if WHOLE in environ else {}  # a parent process's, as it resolved them
        for name in type(self).model_fields:
            if name in values:
                continue
            if name in whole:
                values[name] = whole[name]
            elif (value := environ.get(_PREFIX + name.upper())) is not None:
                values[name] = value
        super().__init__(**values)

    def to_env(self) -> dict[str, str]:
        """These settings whole, as one variable a child process's settings read first (secrets included: the
        variable goes only to processes this one starts)."""
        values = {name: value.get_secret_value() if isinstance(value, SecretStr) else value for name, value in self}
        return {WHOLE: orjson.dumps(values, default=str).decode()}


class InferenceSettings(EnvSettings):
    """Where the models are and how a process loads them."""

    manifest: str = Field(
        default="/opt/models/manifest.toml",
        description="Model manifest (TOML): a path, or s3://bucket/key (then relative model paths are in that "
        "bucket too). The default is where the models layer lands in Lambda.",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads for every model without its own; default: CPUs / workers.",
    )
    eager_load: bool = Field(default=False, description="Load every model at start instead of on first use.")
    worker_group: str | None = Field(
        default=None,
        description="Load only this worker group's models (the manifest's [[groups]]): what `fnserve serve` sets "
        "in the group's inference workers.",
    )
    model_cache_dir: Path = Field(
        default=Path(tempfile.gettempdir()) / "fnserve-models",
        description="Where models fetched from remote stores (s3://) are kept for this process.",
    )
    cache_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="Size bound of the in-process result cache tier."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level of fnserve's loggers."
    )
    device: Literal["any", "cpu"] = Field(
        default="any",
        description="cpu: every model on its CPU providers alone (the CPU workers of a mixed-device pool: a "
        "placement, not a fall back); any: the providers each model's manifest entry lists.",
    )

    @field_validator("manifest", mode="before")
    @classmethod
    def _manifest(cls, value: object) -> object:
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class HttpSettings(EnvSettings):
    """The HTTP API, in Lambda and in the server alike."""

    default_model: str | None = Field(
        default=None,
        description="The model SageMaker's POST /invocations serves when a request names none (no "
        "X-Amzn-SageMaker-Target-Model or model=NAME custom attribute); unset: the manifest's only one.",
    )
    access_log: bool = Field(
        default=True, description="One structured log line per inference request, with stage timings."
    )
    max_request_bytes: int = Field(
        default=6 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted (413 beyond, before parsing); default: "
        "Lambda's 6 MB synchronous payload limit.",
    )
    max_wait_seconds: float = Field(
        default=20.0,
        gt=0,
        le=25.0,
        description="Longest long-poll on GET /v2/results/{id} (API Gateway stops at 29 s); a longer wait "
        "asked for is cut to this.",
    )


class ServerSettings(EnvSettings):
    """The long-running server's processes (``fnserve serve``)."""

    parallel_workers: int = Field(
        default=1,
        ge=0,
        description="Inference worker processes of a long-running server, each with every model; 0 runs "
        "inference in the server's own process (best for models so small that IPC would cost more). "
        "With neither this nor server_processes set, fnserve serve chooses both at start from the models.",
    )
    server_processes: int = Field(
        default=1,
        ge=1,
        description="Front processes of a long-running server (sharing its port), each with its own "
        "parallel_workers; more than one pays when HTTP and JSON, not the model, use the CPU (tiny models).",
    )
    gpu_workers: int = Field(
        default=0,
        ge=0,
        description="Inference worker processes on the GPU (each model on its manifest providers). With "
        "parallel_workers CPU workers beside them (none unless set), calls past gpu_capacity overflow to the CPU.",
    )
    gpu_capacity: int | None = Field(
        default=None,
        ge=1,
        description="Calls in flight on the GPU workers before calls overflow to CPU workers; default: two per "
        "GPU worker (one running, one ready to start).",
    )
    fast_start: bool = Field(
        default=False,
        description="Start to the first answer fast, for platforms that scale to zero (Cloud Run, Knative, "
        "SageMaker Serverless): with no layout given, one front process per CPU runs inference, chosen without "
        "timing the models or reading their memory at start; the models load once in each front process; the "
        "server's own process is the first front process, ready once it listens, and the others start then and "
        "join it.",
    )
    cpu_affinity: bool = Field(
        default=False,
        description="Pin each process that runs inference (an inference worker, or a front process with "
        "parallel_workers = 0) to its own CPUs: the available CPUs split evenly between them, in order. "
        "Threads then stay on one core's caches and processes stop migrating; measure it (fnserve bench).",
    )
    inference_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Longest inference call in a server's worker process: past it the worker is replaced "
        "and the request answered with 504 (and the grace a gRPC call in flight gets at shutdown).",
    )
    metrics: bool = Field(
        default=True,
        description="Prometheus metrics of every server process on GET /metrics (requests, stage latencies, "
        "batches, workers, cache); off: nothing is counted.",
    )
    grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the Open Inference Protocol's gRPC service beside HTTP (needs fnserve[grpc]); "
        "unset, empty or off: no gRPC (a platform that routes one port, where the image's 8081 would only cost "
        "the start time). Its largest request is max_request_bytes (RESOURCE_EXHAUSTED beyond).",
    )
    grpc_host: str = Field(
        default="127.0.0.1", description="Address the gRPC service listens on (fnserve serve: the HTTP --host)."
    )

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _grpc_off(cls, value: object) -> object:
        # A variable cannot be unset by a deploy file over an image's ENV: it can be set to "off" (or empty).
        return None if isinstance(value, str) and value.strip().lower() in ("", "off") else value

    @property
    def inference_processes(self) -> int:
        """Processes that run inference at once, which share the CPUs: front processes x their workers."""
        return self.server_processes * max(1, self.parallel_workers)


class AwsSettings(EnvSettings):
    """Results, the shared cache tier, payloads and follow-ups on AWS (DynamoDB, S3, SQS)."""

    results_table: str | None = Field(
        default=None,
        description="DynamoDB table for job results and the shared result cache tier; unset: in-process only.",
    )
    results_bucket: str | None = Field(
        default=None,
        description="S3 bucket for results and job inputs too big for a DynamoDB item or an SQS message.",
    )
    results: str | None = Field(
        default=None,
        description="Job results and the shared cache tier in Redis instead of DynamoDB: redis://host:6379/0 "
        "(rediss:// for TLS; Memorystore on Google Cloud); unset: FNSERVE_RESULTS_TABLE, if any.",
    )
    followup_queue_url: str | None = Field(
        default=None, description="SQS queue for cascade follow-ups (a cascade may name its own)."
    )
    result_id_key: SecretStr | None = Field(
        default=None,
        description="Key signing follow-up ids; set it (the same in every container) so ids cannot be forged. "
        "Unset, and no result_id_key_secret: derived from the results table name, consistent but not secret.",
    )
    result_id_key_secret: str | None = Field(
        default=None,
        description="Secrets Manager secret (name or ARN) holding that key, read at run time and cached "
        "for 5 minutes (rotations need no redeploy; ids signed with the previous version stay valid).",
    )
    max_receive_count: int = Field(
        default=5,
        ge=1,
        description="The queues' maxReceiveCount: on that delivery, a job that still fails is stored as failed.",
    )
    result_ttl_seconds: int = Field(
        default=7 * 24 * 3600, ge=60, description="How long stored job results live (DynamoDB TTL)."
    )
    request_store_timeout_seconds: float = Field(
        default=0.2,
        gt=0,
        le=30,
        description="Connect and read timeout of each DynamoDB call made while answering a request (the shared "
        "cache tier, result lookups): a stalled table costs a request at most this per attempt.",
    )
    request_store_attempts: int = Field(
        default=2, ge=1, le=10, description="Attempts of each of those calls (botocore's standard retry mode)."
    )
    cache_breaker_failures: int = Field(
        default=3,
        ge=1,
        description="Failed calls in a row after which the shared cache tier is not asked for a while "
        "(every request is then a plain miss, at no cost).",
    )
    cache_breaker_cooldown_seconds: float = Field(
        default=10.0, gt=0, description="How long the shared cache tier rests after failing; then one call tries it."
    )


class GcpSettings(EnvSettings):
    """What only Google Cloud's functions use: the follow-up topic, and how the Pub/Sub job function batches."""

    followup_topic: str | None = Field(
        default=None,
        description="Pub/Sub topic for cascade follow-ups (projects/P/topics/T), instead of followup_queue_url; "
        "a cascade's own queue_url may be a topic too.",
    )
    jobs_gather_ms: float = Field(
        default=5.0,
        ge=0,
        le=1000,
        description="The Pub/Sub job function's gathering window: the jobs an instance receives within it (and "
        "while the previous batch runs) are run as one batch, same-shaped ones in one runtime call.",
    )
    jobs_max_batch: int = Field(default=1000, ge=1, description="Most jobs the Pub/Sub job function runs as one batch.")


class Settings(ServerSettings, HttpSettings, GcpSettings, AwsSettings, InferenceSettings):
    """Every setting of a process, as the composition root (:mod:`fnserve.bootstrap`) reads them."""

    @model_validator(mode="after")
    def _threads(self) -> Settings:
        workers = self.inference_processes
        cpus = available_cpus()
        if self.intra_op_threads is not None and self.intra_op_threads * workers > cpus:
            raise ValueError(
                f"FNSERVE_INTRA_OP_THREADS={self.intra_op_threads} x {workers} processes running inference "
                f"(FNSERVE_SERVER_PROCESSES={self.server_processes}, FNSERVE_PARALLEL_WORKERS="
                f"{self.parallel_workers}) needs {self.intra_op_threads * workers} threads but only "
                f"{cpus} CPUs are available; lower one of them"
            )
        return self


def sagemaker_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """What SageMaker's hosting variables say, where the FNSERVE_* ones do not: its model server's workers
    (``SAGEMAKER_MODEL_SERVER_WORKERS``) and timeout (``SAGEMAKER_MODEL_SERVER_TIMEOUT``, seconds)."""
    found: dict[str, Any] = {}
    for sagemaker, field in (
        ("SAGEMAKER_MODEL_SERVER_WORKERS", "parallel_workers"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "inference_timeout_seconds"),
    ):
        if (value := environ.get(sagemaker)) and not environ.get(_PREFIX + field.upper()):
            found[field] = value
    return found
