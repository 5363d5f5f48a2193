"""Server settings (``FNSERVE_*`` environment variables) and per-model settings (the manifest)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fnserve.core._cpus import available_cpus
from fnserve.core.cascade import CascadeSettings
from fnserve.core.names import check_name

ModelName = Annotated[str, Field(min_length=1, max_length=128)]


class TensorOverride(BaseModel):
    """What the manifest may say about one input or output beyond what the ONNX graph says."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: list[int] | None = Field(
        default=None,
        description="Shape to advertise and enforce (-1 for a variable dimension); must have the "
        "graph's rank and agree with its fixed dimensions.",
    )


class ModelSettings(BaseModel):
    """One model version in the manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ModelName = Field(description="Model name used in URLs and job records.")
    version: str = Field(default="1", description="Version label; the highest is the default.")
    path: str = Field(description="ONNX file: a path relative to the manifest, an absolute path, or s3://bucket/key.")
    sha256: str = Field(description="Hex SHA-256 of the ONNX file; a mismatch refuses the load.")
    description: str = Field(default="", description="Free text shown in model metadata.")
    inputs: dict[str, TensorOverride] = Field(
        default_factory=dict, description="Per-input overrides, keyed by the graph's input name."
    )
    outputs: dict[str, TensorOverride] = Field(
        default_factory=dict, description="Per-output overrides, keyed by the graph's output name."
    )
    max_batch_size: int = Field(
        default=1024,
        ge=1,
        description="Largest batch sent to the runtime in one call; bigger requests are chunked.",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="ONNX Runtime intra-op threads; default: available CPUs / worker processes.",
    )
    inter_op_threads: int = Field(default=1, ge=1, description="ONNX Runtime inter-op threads.")
    execution_providers: list[str] = Field(
        default_factory=lambda: ["CPUExecutionProvider"],
        min_length=1,
        description="ONNX Runtime execution providers in order of preference.",
    )
    graph_optimization: Literal["disable", "basic", "extended", "all"] = Field(
        default="all", description="ONNX Runtime graph optimisation level."
    )
    max_batch_time_ms: float | None = Field(
        default=None,
        gt=0,
        description="Adaptive batching in long-running servers: gather concurrent requests for at most this long "
        "after the first one (and at most max_batch_size rows); off when unset.",
    )
    length_buckets: list[int] = Field(
        default_factory=list,
        description="Sequence lengths that batched variable-length inputs are padded up to (sorted, positive).",
    )
    pad_inputs: list[str] = Field(default_factory=list, description="Inputs padded along axis 1 to their bucket.")
    pad_value: float = Field(default=0.0, description="Value the padding is filled with.")
    cache_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Cache this model's results for this long (in-process and DynamoDB); off when unset.",
    )
    warmup: bool = Field(
        default=True,
        description="Run one zero-filled batch at load, so the first request does not pay the "
        "runtime's first-run allocations.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "model name")

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        return check_name(value, "model version")

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str) -> str:
        value = value.lower()
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("sha256 must be 64 hex digits")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if value.startswith("s3://"):
            bucket, _, key = value[5:].partition("/")
            if not bucket or not key:
                raise ValueError(f"s3 path {value!r} must be s3://bucket/key")
        elif not value:
            raise ValueError("path must not be empty")
        return value

    @model_validator(mode="after")
    def _batching(self) -> ModelSettings:
        if any(b < 1 for b in self.length_buckets) or self.length_buckets != sorted(set(self.length_buckets)):
            raise ValueError(f"length_buckets must be positive and ascending, got {self.length_buckets}")
        if self.pad_inputs and not self.length_buckets:
            raise ValueError("pad_inputs needs length_buckets to pad up to")
        if (self.length_buckets or self.pad_inputs) and self.max_batch_time_ms is None:
            raise ValueError("length_buckets and pad_inputs only apply with max_batch_time_ms (adaptive batching)")
        return self

    @model_validator(mode="after")
    def _overrides(self) -> ModelSettings:
        for kind, overrides in (("input", self.inputs), ("output", self.outputs)):
            for tensor, override in overrides.items():
                if override.shape is not None and any(d < -1 or d == 0 for d in override.shape):
                    raise ValueError(
                        f"{kind} {tensor!r}: shape dimensions must be positive or -1, got {override.shape}"
                    )
        return self


class Manifest(BaseModel):
    """The model manifest: every model version this deployment serves, and its cascades."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[ModelSettings] = Field(min_length=1, description="Served model versions.")
    cascades: list[CascadeSettings] = Field(default_factory=list, description="Fast-then-accurate model pairs.")
    base_dir: Path = Field(default=Path("."), description="Directory relative model paths are resolved against.")

    @model_validator(mode="after")
    def _unique(self) -> Manifest:
        seen: set[tuple[str, str]] = set()
        for model in self.models:
            key = (model.name, model.version)
            if key in seen:
                raise ValueError(f"model {model.name!r} version {model.version!r} is listed twice")
            seen.add(key)
        models = {m.name for m in self.models}
        taken = set(models)
        for cascade in self.cascades:
            if cascade.name in taken:
                raise ValueError(f"cascade {cascade.name!r}: the name is already a model's or a cascade's")
            for role, member in (("fast", cascade.fast), ("slow", cascade.slow)):
                if member not in models:
                    raise ValueError(f"cascade {cascade.name!r}: its {role} model {member!r} is not in the manifest")
            taken.add(cascade.name)
        return self


class Settings(BaseSettings):
    """Server-wide settings, read from ``FNSERVE_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="FNSERVE_", extra="ignore", frozen=True)

    manifest: str = Field(
        default="/opt/models/manifest.toml",
        description="Model manifest (TOML): a path, or s3://bucket/key (then relative model paths are in that "
        "bucket too). The default is where the models layer lands in Lambda.",
    )
    parallel_workers: int = Field(
        default=1,
        ge=0,
        description="Inference worker processes of a long-running server, each with every model; 0 runs "
        "inference in the server's own process (best for models so small that IPC would cost more).",
    )
    server_processes: int = Field(
        default=1,
        ge=1,
        description="Front processes of a long-running server (sharing its port), each with its own "
        "parallel_workers; more than one pays when HTTP and JSON, not the model, use the CPU (tiny models).",
    )
    inference_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Longest inference call in a server's worker process: past it the worker is replaced "
        "and the request answered with 504.",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads for every model without its own; default: CPUs / workers.",
    )
    eager_load: bool = Field(default=False, description="Load every model at start instead of on first use.")
    model_cache_dir: Path = Field(
        default=Path(tempfile.gettempdir()) / "fnserve-models",
        description="Where models fetched from remote stores (s3://) are kept for this process.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level of fnserve's loggers."
    )
    access_log: bool = Field(
        default=True, description="One structured log line per inference request, with stage timings."
    )
    results_table: str | None = Field(
        default=None,
        description="DynamoDB table for job results and the shared result cache tier; unset: in-process only.",
    )
    results_bucket: str | None = Field(
        default=None,
        description="S3 bucket for results and job inputs too big for a DynamoDB item or an SQS message.",
    )
    cache_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="Size bound of the in-process result cache tier."
    )
    followup_queue_url: str | None = Field(
        default=None, description="SQS queue for cascade follow-ups (a cascade may name its own)."
    )
    result_id_key: SecretStr | None = Field(
        default=None,
        description="Key signing follow-up ids; set it (the same in every container) so ids cannot be forged. "
        "Unset: derived from the results table name, which keeps ids consistent but not secret.",
    )
    max_wait_seconds: float = Field(
        default=20.0,
        gt=0,
        le=25.0,
        description="Longest long-poll on GET /v2/results/{id} (API Gateway stops at 29 s).",
    )
    max_receive_count: int = Field(
        default=5,
        ge=1,
        description="The queues' maxReceiveCount: on that delivery, a job that still fails is stored as failed.",
    )
    result_ttl_seconds: int = Field(
        default=7 * 24 * 3600, ge=60, description="How long stored job results live (DynamoDB TTL)."
    )
    max_request_bytes: int = Field(
        default=6 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted (413 beyond, before parsing); default: "
        "Lambda's 6 MB synchronous payload limit.",
    )

    @field_validator("manifest", mode="before")
    @classmethod
    def _manifest(cls, value: object) -> object:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @property
    def inference_processes(self) -> int:
        """Processes that run inference at once, which share the CPUs: front processes x their workers."""
        return self.server_processes * max(1, self.parallel_workers)

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
