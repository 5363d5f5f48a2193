"""Write docs/settings.md's tables: every ``FNSERVE_*`` setting, from the settings classes' fields and their
descriptions, and the other environment variables fnserve reads (Powertools', OpenTelemetry's, Lambda's, ...).

python infra/docs/settings_reference.py      (rewrites the page between its markers; a test fails when it is stale)

The second table's rows are data here: what fnserve does with each variable is read off the code by a person,
and tests/functional/test_settings_reference.py checks that fnserve (or the library named) does read each one.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from fnserve.settings import EnvSettings, SecretStr, Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
BEGIN = "<!-- written by infra/docs/settings_reference.py from here -->"
END = "<!-- to here -->"
PREFIX = "FNSERVE_"


@dataclass(frozen=True)
class Variable:
    """An environment variable fnserve honours outside the settings classes, and what it does with it."""

    name: str
    does: str
    reader: str = "fnserve"  # or the library module that reads it, where fnserve leaves it to that library


OTHERS: dict[str, tuple[Variable, ...]] = {
    "fnserve's own, outside the settings classes": (
        Variable("FNSERVE_HOST", "`fnserve serve --host`'s default: the address it listens on (`127.0.0.1`)."),
        Variable("FNSERVE_PORT", "`fnserve serve --port`'s default: the HTTP port (`8080`)."),
        Variable("FNSERVE_JOBS_QUEUE", "`fnserve submit --queue`'s default: the SQS queue jobs are sent to."),
        Variable("FNSERVE_JOBS_TOPIC", "`fnserve submit --topic`'s default: a Pub/Sub topic, instead."),
        Variable(
            "FNSERVE_EXPORT_PYTHON",
            "`fnserve import --export-python`'s default: the Python with optimum and torch that exports a Hugging "
            "Face folder shipping no ONNX file.",
        ),
        Variable(
            "FNSERVE_LOG_FORMAT",
            "How `fnserve serve` writes log lines: `auto` (unset: `console` at a terminal, else `json`), `json` "
            "or `console`; its front processes and workers follow its choice.",
        ),
        Variable(
            "FNSERVE_SETTINGS",
            "Set by a server for the processes it starts: its settings whole, as JSON, read before any other "
            "`FNSERVE_*` variable. Not yours to set.",
        ),
        Variable(
            "FNSERVE_STATISTICS_DIR",
            "Set by `fnserve serve` for its front processes: where they share their statistics. Not yours to set.",
        ),
        Variable(
            "FNSERVE_AFFINITY_DIR",
            "Set by `fnserve serve` with `FNSERVE_CPU_AFFINITY`: the CPU slot locks its processes share. "
            "Not yours to set.",
        ),
    ),
    "Logs and Lambda metrics (Powertools)": (
        Variable(
            "POWERTOOLS_SERVICE_NAME",
            "The `service` key of every log line, and the `service` dimension of the Lambda functions' metrics "
            "(default `fnserve`; `fnserve-batch` for the job function's metrics).",
        ),
        Variable(
            "POWERTOOLS_METRICS_NAMESPACE",
            "The CloudWatch namespace of the Lambda functions' metrics (embedded metric format; default `fnserve`).",
        ),
        Variable("POWERTOOLS_METRICS_DISABLED", "`true`: the Lambda functions write no metrics."),
        Variable("POWERTOOLS_LOG_LEVEL", "The log level where `FNSERVE_LOG_LEVEL` is not set."),
        Variable(
            "AWS_LAMBDA_LOG_LEVEL",
            "Lambda's (the function's `LoggingConfig` `ApplicationLogLevel`): the log level where neither "
            "`FNSERVE_LOG_LEVEL` nor `POWERTOOLS_LOG_LEVEL` is set.",
        ),
    ),
    "Traces (OpenTelemetry; needs `fnserve[tracing]`)": (
        Variable(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "Set (or the next one), spans are exported over OTLP/HTTP to it; with neither set, nor "
            "`OTEL_TRACES_EXPORTER=console`, tracing is off and OpenTelemetry is not imported.",
        ),
        Variable("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "The same, for traces alone; it wins over the one above."),
        Variable("OTEL_TRACES_EXPORTER", "`console`: spans printed as JSON instead of exported (the only value read)."),
        Variable(
            "OTEL_SERVICE_NAME",
            "The traces' `service.name` (default: the Lambda function's name, else `fnserve`).",
        ),
        Variable(
            "OTEL_INSTRUMENTATION_AWS_LAMBDA_FLUSH_TIMEOUT",
            "Milliseconds a Lambda invocation waits at most for its spans to be exported before it returns "
            "(default 30000).",
        ),
        Variable(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Headers the OTLP exporter sends (a collector's API key).",
            reader="opentelemetry.exporter.otlp.proto.http",
        ),
        Variable("OTEL_TRACES_SAMPLER", "Which requests are traced (the SDK's sampler).", reader="opentelemetry.sdk"),
        Variable("OTEL_TRACES_SAMPLER_ARG", "The sampler's argument (a ratio).", reader="opentelemetry.sdk"),
        Variable(
            "OTEL_RESOURCE_ATTRIBUTES",
            "More attributes of the traces' resource (`key=value,...`).",
            reader="opentelemetry.sdk",
        ),
    ),
    "AWS clients": (
        Variable(
            "AWS_ENDPOINT_URL",
            "botocore's: the endpoint of every AWS client (`AWS_ENDPOINT_URL_SQS` and the like per service, "
            "first). fnserve reads it to know a local emulator (`fnserve local` prints it), where any region "
            "and keys do.",
        ),
        Variable("LOCALSTACK_HOST", "Set, the AWS clients go to LocalStack's endpoints (needs localstack-client)."),
        Variable(
            "AWS_RETRY_MODE",
            "botocore's: set, it replaces fnserve's `standard` retry mode in the clients not answering a request "
            "(those have `FNSERVE_REQUEST_STORE_*`).",
        ),
        Variable("AWS_MAX_ATTEMPTS", "botocore's: set, it replaces fnserve's attempts in those clients likewise."),
    ),
    "The platform: Lambda, SageMaker, Cloud Functions, Cloud Run, Prometheus": (
        Variable(
            "AWS_LAMBDA_FUNCTION_NAME",
            "On Lambda: the traces' `faas.name` (and `service.name` without `OTEL_SERVICE_NAME`); set, traces "
            "carry Lambda's `cloud.*` and `faas.*` attributes.",
        ),
        Variable("AWS_REGION", "On Lambda: the traces' `cloud.region`."),
        Variable("AWS_LAMBDA_FUNCTION_VERSION", "On Lambda: the traces' `faas.version`."),
        Variable("AWS_LAMBDA_LOG_STREAM_NAME", "On Lambda: the traces' `faas.instance`."),
        Variable("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "On Lambda: the traces' `faas.max_memory`."),
        Variable(
            "_X_AMZN_TRACE_ID",
            "On Lambda, the invocation's X-Ray trace: each access log line's `xray_trace_id`, and the "
            "`AWSTraceHeader` of a follow-up sent to SQS, which links the two in X-Ray.",
        ),
        Variable(
            "SAGEMAKER_MODEL_SERVER_WORKERS",
            "SageMaker's: `fnserve serve`'s inference workers where `FNSERVE_PARALLEL_WORKERS` is not set.",
        ),
        Variable(
            "SAGEMAKER_MODEL_SERVER_TIMEOUT",
            "SageMaker's: `fnserve serve`'s inference timeout (seconds) where `FNSERVE_INFERENCE_TIMEOUT_SECONDS` "
            "is not set.",
        ),
        Variable(
            "GOOGLE_CLOUD_PROJECT",
            "The project of the trace each Cloud Logging line carries (`projects/P/traces/T`), and the traces' "
            "`cloud.account.id`.",
        ),
        Variable("GCP_PROJECT", "The project of those log lines, where `GOOGLE_CLOUD_PROJECT` is not set."),
        Variable(
            "K_SERVICE",
            "With `FUNCTION_TARGET`, on Cloud Functions: traces carry its `cloud.*` and `faas.*` attributes, "
            "`faas.name` this.",
        ),
        Variable("FUNCTION_TARGET", "See `K_SERVICE`."),
        Variable("K_REVISION", "On Cloud Functions: the traces' `faas.version`."),
        Variable(
            "PORT",
            "Cloud Run's and Knative's port for a container: `fnserve serve` listens on it when neither `--port` "
            "nor `FNSERVE_PORT` says another.",
        ),
        Variable(
            "PROMETHEUS_MULTIPROC_DIR",
            "prometheus-client's: where a server's processes keep their metrics; unset, `fnserve serve` makes one "
            "(and removes it), set, the directory is yours.",
        ),
    ),
}


def setting_classes() -> list[type[EnvSettings]]:
    """The classes :class:`Settings` is made of (itself too, should it have fields of its own), base first."""
    return [
        cls
        for cls in reversed(Settings.__mro__)
        if isinstance(cls, type) and issubclass(cls, EnvSettings) and own_fields(cls)
    ]


def own_fields(cls: type[EnvSettings]) -> list[str]:
    return [name for name in vars(cls).get("__annotations__", {}) if name in Settings.field_names()]


@dataclass(frozen=True)
class Field:
    """A setting as its class declares it: ``Annotated[kind, Meta(...)]``, ``| None`` where it may be unset."""

    kind: Any
    meta: msgspec.Meta
    default: Any

    @property
    def description(self) -> str:
        return self.meta.description or ""


def fields() -> dict[str, Field]:
    hints = typing.get_type_hints(Settings, include_extras=True)
    found = {}
    for field in dataclasses.fields(Settings):
        kind: Any = hints[field.name]
        if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:  # X | None: X, unset allowed
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        meta = msgspec.Meta()
        if typing.get_origin(kind) is typing.Annotated:
            kind, meta = typing.get_args(kind)[:2]
        found[field.name] = Field(kind, meta, field.default)
    return found


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


def _type(field: Field) -> str:
    if typing.get_origin(field.kind) is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(field.kind))
    names = {bool: "bool", int: "int", float: "float", str: "str", Path: "path", SecretStr: "str (secret)"}
    bounds = [f"{sign} {bound:g}" for name, sign in _BOUNDS if (bound := getattr(field.meta, name)) is not None]
    return " ".join([names[field.kind], ", ".join(bounds)]).strip()


def _default(name: str, value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path) and value.is_relative_to(tempfile.gettempdir()):  # this machine's: say which
        return f"`{Path('<temp dir>', value.relative_to(tempfile.gettempdir()))}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int) and name.endswith("_bytes") and value % 2**20 == 0:
        return f"`{value}` ({value // 2**20} MiB)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_tables() -> str:
    """A table per settings class: each field's variable, type, default and description (other fields' names in
    it written as their variables)."""
    described = fields()
    named = re.compile(r"\b(" + "|".join(sorted((n for n in described if "_" in n), key=len, reverse=True)) + r")\b")
    parts = []
    for cls in setting_classes():
        doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        rows = [f"### `{cls.__name__}`\n", f"{doc}\n", "| variable | type | default | what it does |", "|" + "---|" * 4]
        for name in own_fields(cls):
            field = described[name]
            does = named.sub(lambda m: f"`{PREFIX}{m[1].upper()}`", field.description or "")
            variable = f"`{PREFIX}{name.upper()}`"
            rows.append(f"| {variable} | {_type(field)} | {_default(name, field.default)} | {_cell(does)} |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def others_tables() -> str:
    parts = []
    for group, variables in OTHERS.items():
        rows = [f"### {group}\n", "| variable | read by | what fnserve does with it |", "|" + "---|" * 3]
        for v in variables:
            reader = v.reader if v.reader == "fnserve" else f"`{v.reader}`"
            rows.append(f"| `{v.name}` | {reader} | {_cell(v.does)} |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def reference() -> str:
    """What goes between the page's markers."""
    return (
        f"{BEGIN}\n\n## The settings: `FNSERVE_*`\n\n{settings_tables()}\n"
        f"## Other variables fnserve reads\n\n{others_tables()}\n{END}"
    )


def generated(page: str) -> str:
    """The part of ``page`` between its markers, the markers included."""
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[start:end]


if __name__ == "__main__":
    text = PAGE.read_text()
    PAGE.write_text(text.replace(generated(text), reference()))
    sys.stdout.write(f"wrote {PAGE}\n")
