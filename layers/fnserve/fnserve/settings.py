"""Environment settings (``FNSERVE_*`` variables), one class per concern.

Each part of fnserve takes the narrowest class it needs (the HTTP app :class:`HttpSettings`,
the result store :class:`AwsSettings`, ...); the composition root reads :class:`Settings`,
which is all of them, once per process. What one model does is the manifest's business
(:mod:`fnserve.core.models.manifest`), not the environment's.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

import msgspec
import orjson
from msgspec import Meta

from fnserve.core.errors import ConfigError, refused_at
from fnserve.core.host import available_cpus

_PREFIX = "FNSERVE_"
WHOLE = "FNSERVE_SETTINGS"  # every setting of a parent process (a server's), as JSON: see EnvSettings.to_env
# What pydantic, and so every earlier fnserve, read as a boolean.
_BOOLS = {word: True for word in ("1", "true", "t", "yes", "y", "on")} | {
    word: False for word in ("0", "false", "f", "no", "n", "off")
}


class SecretStr:
    """A secret setting's value, kept out of reprs and logs: ``get_secret_value()`` reads it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "SecretStr('**********')"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _decode(kind: type, value: Any) -> Any:
    """The settings' types msgspec does not know, from the strings the environment holds."""
    if isinstance(value, kind):
        return value
    if kind in (Path, SecretStr) and isinstance(value, str):
        return kind(value)
    raise ValueError(f"Expected `str`, got `{type(value).__name__}`")  # msgspec adds where


class EnvSettings:
    """Settings read from ``FNSERVE_<FIELD>`` variables (names case-insensitive); values given to the
    constructor take precedence, and either counts as set (``fields_set``). A subclass is a frozen dataclass
    whose fields say their type, bounds and description (``Annotated[int, Meta(ge=1, description=...)]``).

    Validated by msgspec from the variables' strings: pydantic's import and model builds would weigh on every
    cold start (docs/design/start.md). A bad value raises :class:`~fnserve.core.errors.ConfigError` naming its
    variable (and the value, unless it is a secret).
    """

    fields_set: frozenset[str]
    _bools: ClassVar[frozenset[str]]
    _secrets: ClassVar[frozenset[str]]

    def __init__(self, **values: Any) -> None:
        environ = {key.upper(): value for key, value in os.environ.items() if key.upper().startswith(_PREFIX)}
        whole = orjson.loads(environ[WHOLE]) if WHOLE in environ else {}  # a parent process's, as it resolved them
        for name in self.field_names():
            if name in values:
                continue
            if name in whole:
                values[name] = whole[name]
            elif (value := environ.get(_PREFIX + name.upper())) is not None:
                values[name] = value
        self._take(type(self)._checked(values), frozenset(values))

    @classmethod
    def field_names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def _prepare(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The values as msgspec takes them: paths as text, booleans from the words people write."""
        if "_bools" not in vars(cls):
            hints = typing.get_type_hints(cls)
            cls._bools = frozenset(name for name in cls.field_names() if hints[name] is bool)
            secret = {name for name in cls.field_names() if SecretStr in (hints[name], *typing.get_args(hints[name]))}
            cls._secrets = frozenset(secret)
        prepared = {}
        for name, value in values.items():
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            elif name in cls._bools and isinstance(value, str) and value.strip().lower() in _BOOLS:
                value = _BOOLS[value.strip().lower()]
            prepared[name] = value
        return prepared

    @classmethod
    def _checked(cls, values: dict[str, Any]) -> Any:
        try:
            return msgspec.convert(cls._prepare(values), cls, strict=False, dec_hook=_decode)
        except msgspec.ValidationError as exc:
            loc, message = refused_at(exc)
            name = str(loc[0]) if len(loc) == 1 else ""
            if name in values:
                shown = "" if name in cls._secrets else f"={values[name]!r}"
                raise ConfigError(f"{_PREFIX}{name.upper()}{shown}: {message}") from None
            raise ConfigError(message) from None

    def _take(self, checked: Any, fields_set: frozenset[str]) -> None:
        for name in self.field_names():
            object.__setattr__(self, name, getattr(checked, name))
        object.__setattr__(self, "fields_set", fields_set)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (validated, and counted as set); the environment is not read again."""
        copy = object.__new__(type(self))
        values = {name: getattr(self, name) for name in self.field_names()} | changes
        copy._take(type(self)._checked(values), self.fields_set | changes.keys())
        return copy

    def to_env(self) -> dict[str, str]:
        """These settings whole, as one variable a child process's settings read first (secrets included: the
        variable goes only to processes this one starts)."""
        values = {}
        for name in self.field_names():
            value = getattr(self, name)
            values[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return {WHOLE: orjson.dumps(values, default=str).decode()}


@dataclass(frozen=True, init=False)
class InferenceSettings(EnvSettings):
    """Where the models are and how a process loads them."""

    manifest: Annotated[
        str,
        Meta(
            description="Model manifest (TOML): a path, or s3://bucket/key (then relative model paths are in that "
            "bucket too). The default is where the models layer lands in Lambda."
        ),
    ] = "/opt/models/manifest.toml"
    intra_op_threads: (
        Annotated[
            int, Meta(ge=1, description="Intra-op threads for every model without its own; default: CPUs / workers.")
        ]
        | None
    ) = None
    eager_load: Annotated[bool, Meta(description="Load every model at start instead of on first use.")] = False
    worker_group: (
        Annotated[
            str,
            Meta(
                description="Load only this worker group's models (the manifest's [[groups]]): what `fnserve serve` "
                "sets in the group's inference workers."
            ),
        ]
        | None
    ) = None
    model_cache_dir: Annotated[
        Path, Meta(description="Where models fetched from remote stores (s3://) are kept for this process.")
    ] = Path(tempfile.gettempdir()) / "fnserve-models"
    cache_max_bytes: Annotated[int, Meta(ge=0, description="Size bound of the in-process result cache tier.")] = (
        64 * 1024 * 1024
    )
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR"], Meta(description="Log level of fnserve's loggers.")
    ] = "INFO"
    device: Annotated[
        Literal["any", "cpu"],
        Meta(
            description="cpu: every model on its CPU providers alone (the CPU workers of a mixed-device pool: a "
            "placement, not a fall back); any: the providers each model's manifest entry lists."
        ),
    ] = "any"


@dataclass(frozen=True, init=False)
class HttpSettings(EnvSettings):
    """The HTTP API, in Lambda and in the server alike."""

    default_model: (
        Annotated[
            str,
            Meta(
                description="The model SageMaker's POST /invocations serves when a request names none (no "
                "X-Amzn-SageMaker-Target-Model or model=NAME custom attribute); unset: the manifest's only one."
            ),
        ]
        | None
    ) = None
    tei_model: (
        Annotated[
            str,
            Meta(
                description="The pipeline text-embeddings-inference's routes serve at the root (POST /embed, "
                "/rerank, /predict, POST /), as a TEI server serves its one model; the others answer under "
                "/tei/NAME/. Unset: the manifest's first embedding pipeline (else its first reranker or classifier)."
            ),
        ]
        | None
    ) = None
    api_keys: (
        Annotated[
            SecretStr,
            Meta(
                description="API keys a caller must send (HTTP: Authorization: Bearer KEY; gRPC: the authorization "
                "metadata), separated by commas or newlines; several at once to rotate them. Unset, with no "
                "api_keys_file or api_keys_secret: anyone who reaches the port is answered."
            ),
        ]
        | None
    ) = None
    api_keys_file: (
        Annotated[
            str,
            Meta(
                description="A file of API keys, one per line (a mounted Kubernetes or Cloud Run secret), read again "
                "when it changes: keys rotate with no restart."
            ),
        ]
        | None
    ) = None
    api_keys_secret: (
        Annotated[
            str,
            Meta(
                description="Secrets Manager secret (name or ARN) holding the API keys (one per line, or comma-"
                "separated), read at run time and cached for 5 minutes; after a rotation its previous version's "
                "keys stay valid."
            ),
        ]
        | None
    ) = None
    metrics_need_key: Annotated[
        bool,
        Meta(
            description="GET /metrics asks for an API key too, where keys are set; off, it stays open to the "
            "scrape, as the health checks do."
        ),
    ] = False
    access_log: Annotated[
        bool, Meta(description="One structured log line per inference request, with stage timings.")
    ] = True
    max_request_bytes: Annotated[
        int,
        Meta(
            ge=1024,
            description="Largest request body accepted (413 beyond, before parsing); default: "
            "Lambda's 6 MB synchronous payload limit.",
        ),
    ] = 6 * 1024 * 1024
    max_wait_seconds: Annotated[
        float,
        Meta(
            gt=0,
            le=25.0,
            description="Longest long-poll on GET /v2/results/{id} (API Gateway stops at 29 s); a longer wait "
            "asked for is cut to this.",
        ),
    ] = 20.0


@dataclass(frozen=True, init=False)
class ServerSettings(EnvSettings):
    """The long-running server's processes (``fnserve serve``)."""

    parallel_workers: Annotated[
        int,
        Meta(
            ge=0,
            description="Inference worker processes of a long-running server, each with every model; 0 runs "
            "inference in the server's own process (best for models so small that IPC would cost more). "
            "With neither this nor server_processes set, fnserve serve chooses both at start from the models.",
        ),
    ] = 1
    server_processes: Annotated[
        int,
        Meta(
            ge=1,
            description="Front processes of a long-running server (sharing its port), each with its own "
            "parallel_workers; more than one pays when HTTP and JSON, not the model, use the CPU (tiny models).",
        ),
    ] = 1
    gpu_workers: Annotated[
        int,
        Meta(
            ge=0,
            description="Inference worker processes on the GPU (each model on its manifest providers). With "
            "parallel_workers CPU workers beside them (none unless set), calls past gpu_capacity overflow to the CPU.",
        ),
    ] = 0
    gpu_capacity: (
        Annotated[
            int,
            Meta(
                ge=1,
                description="Calls in flight on the GPU workers before calls overflow to CPU workers; default: two per "
                "GPU worker (one running, one ready to start).",
            ),
        ]
        | None
    ) = None
    fast_start: Annotated[
        bool,
        Meta(
            description="Start to the first answer fast, for platforms that scale to zero (Cloud Run, Knative, "
            "SageMaker Serverless): with no layout given, one front process per CPU runs inference, chosen without "
            "timing the models or reading their memory at start; the models load once in each front process; the "
            "server's own process is the first front process, ready once it listens, and the others start once it "
            "has answered its first inference, and join it."
        ),
    ] = False
    answer_while_loading: Annotated[
        bool,
        Meta(
            description="Answer 503 on the HTTP port while the models load, so health checks and load balancers see "
            "'not ready' instead of a refused connection. Off: the port stays closed until the server can answer, "
            "for a platform that sends requests as soon as the port accepts them (Cloud Run's TCP startup probe), "
            "which then need no HTTP probe and its period's wait."
        ),
    ] = True
    cpu_affinity: Annotated[
        bool,
        Meta(
            description="Pin each process that runs inference (an inference worker, or a front process with "
            "parallel_workers = 0) to its own CPUs: the available CPUs split evenly between them, in order. "
            "Threads then stay on one core's caches and processes stop migrating; measure it (fnserve bench)."
        ),
    ] = False
    inference_timeout_seconds: Annotated[
        float,
        Meta(
            gt=0,
            description="Longest inference call in a server's worker process: past it the worker is replaced "
            "and the request answered with 504 (and the grace a gRPC call in flight gets at shutdown).",
        ),
    ] = 60.0
    request_timeout_seconds: (
        Annotated[
            float,
            Meta(
                gt=0,
                description="The longest a caller waits for an answer from this server or function (Cloud Run's "
                "request timeout, a Cloud Function's timeout): a request whose texts cannot be run in that time at "
                "the model's pace is refused at once (413) instead of computed for nobody, and the Pub/Sub jobs "
                "function hands back (503) the jobs a push cannot reach in it. Unset: only a caller's own timeout "
                "bounds a request.",
            ),
        ]
        | None
    ) = None
    metrics: Annotated[
        bool,
        Meta(
            description="Prometheus metrics of every server process on GET /metrics (requests, stage latencies, "
            "batches, workers, cache); off: nothing is counted."
        ),
    ] = True
    grpc_port: (
        Annotated[
            int,
            Meta(
                ge=0,
                le=65535,
                description="Port of the Open Inference Protocol's gRPC service beside HTTP (needs fnserve[grpc]); "
                "unset, empty or off: no gRPC (a platform that routes one port, where the image's 8081 would only cost "
                "the start time). Its largest request is max_request_bytes (RESOURCE_EXHAUSTED beyond).",
            ),
        ]
        | None
    ) = None
    grpc_host: Annotated[
        str, Meta(description="Address the gRPC service listens on (fnserve serve: the HTTP --host).")
    ] = "127.0.0.1"

    @classmethod
    def _prepare(cls, values: dict[str, Any]) -> dict[str, Any]:
        # A variable cannot be unset by a deploy file over an image's ENV: it can be set to "off" (or empty).
        port = values.get("grpc_port")
        if isinstance(port, str) and port.strip().lower() in ("", "off"):
            values = {**values, "grpc_port": None}
        return super()._prepare(values)

    @property
    def inference_processes(self) -> int:
        """Processes that run inference at once, which share the CPUs: front processes x their workers."""
        return self.server_processes * max(1, self.parallel_workers)


@dataclass(frozen=True, init=False)
class AwsSettings(EnvSettings):
    """Results, the shared cache tier, payloads and follow-ups on AWS (DynamoDB, S3, SQS)."""

    results_table: (
        Annotated[
            str,
            Meta(
                description="DynamoDB table for job results and the shared result cache tier; unset: in-process only."
            ),
        ]
        | None
    ) = None
    results_bucket: (
        Annotated[
            str, Meta(description="S3 bucket for results and job inputs too big for a DynamoDB item or an SQS message.")
        ]
        | None
    ) = None
    results: (
        Annotated[
            str,
            Meta(
                description="Job results and the shared cache tier in Redis instead of DynamoDB: redis://host:6379/0 "
                "(rediss:// for TLS; Memorystore on Google Cloud); unset: FNSERVE_RESULTS_TABLE, if any."
            ),
        ]
        | None
    ) = None
    followup_queue_url: (
        Annotated[str, Meta(description="SQS queue for cascade follow-ups (a cascade may name its own).")] | None
    ) = None
    result_id_key: (
        Annotated[
            SecretStr,
            Meta(
                description="Key signing follow-up ids; set it (the same in every container) so ids cannot be forged. "
                "Unset, and no result_id_key_secret: derived from the results table name, consistent but not secret."
            ),
        ]
        | None
    ) = None
    result_id_key_secret: (
        Annotated[
            str,
            Meta(
                description="Secrets Manager secret (name or ARN) holding that key, read at run time and cached "
                "for 5 minutes (rotations need no redeploy; ids signed with the previous version stay valid)."
            ),
        ]
        | None
    ) = None
    max_receive_count: Annotated[
        int,
        Meta(
            ge=1,
            description="The queues' maxReceiveCount: on that delivery, a job that still fails is stored as failed.",
        ),
    ] = 5
    result_ttl_seconds: Annotated[int, Meta(ge=60, description="How long stored job results live (DynamoDB TTL).")] = (
        7 * 24 * 3600
    )
    request_store_timeout_seconds: Annotated[
        float,
        Meta(
            gt=0,
            le=30,
            description="Connect and read timeout of each DynamoDB call made while answering a request (the shared "
            "cache tier, result lookups): a stalled table costs a request at most this per attempt.",
        ),
    ] = 0.2
    request_store_attempts: Annotated[
        int, Meta(ge=1, le=10, description="Attempts of each of those calls (botocore's standard retry mode).")
    ] = 2
    cache_breaker_failures: Annotated[
        int,
        Meta(
            ge=1,
            description="Failed calls in a row after which the shared cache tier is not asked for a while "
            "(every request is then a plain miss, at no cost).",
        ),
    ] = 3
    cache_breaker_cooldown_seconds: Annotated[
        float, Meta(gt=0, description="How long the shared cache tier rests after failing; then one call tries it.")
    ] = 10.0


@dataclass(frozen=True, init=False)
class GcpSettings(EnvSettings):
    """What only Google Cloud's functions use: the follow-up topic, and how the Pub/Sub job function batches."""

    followup_topic: (
        Annotated[
            str,
            Meta(
                description="Pub/Sub topic for cascade follow-ups (projects/P/topics/T), instead of "
                "followup_queue_url; a cascade's own queue_url may be a topic too."
            ),
        ]
        | None
    ) = None
    jobs_gather_ms: Annotated[
        float,
        Meta(
            ge=0,
            le=1000,
            description="The Pub/Sub job function's gathering window: the jobs an instance receives within it (and "
            "while the previous batch runs) are run as one batch, same-shaped ones in one runtime call.",
        ),
    ] = 5.0
    jobs_max_batch: Annotated[int, Meta(ge=1, description="Most jobs the Pub/Sub job function runs as one batch.")] = (
        1000
    )


@dataclass(frozen=True, init=False)
class Settings(ServerSettings, HttpSettings, GcpSettings, AwsSettings, InferenceSettings):
    """Every setting of a process, as the composition root (:mod:`fnserve.bootstrap`) reads them."""

    def __post_init__(self) -> None:  # msgspec's check of the whole, once every field is
        workers = self.inference_processes
        cpus = available_cpus()
        if self.intra_op_threads is not None and self.intra_op_threads * workers > cpus:
            raise ValueError(
                f"FNSERVE_INTRA_OP_THREADS={self.intra_op_threads} x {workers} processes running inference "
                f"(FNSERVE_SERVER_PROCESSES={self.server_processes}, FNSERVE_PARALLEL_WORKERS="
                f"{self.parallel_workers}) needs {self.intra_op_threads * workers} threads but only "
                f"{cpus} CPUs are available; lower one of them"
            )


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
