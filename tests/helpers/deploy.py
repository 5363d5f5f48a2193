"""What the deploy files (infra/kubernetes, infra/gcp/cloudrun) are checked against: the image as
infra/container/Dockerfile builds it, fnserve serve's health routes, and Kubernetes' schemas and quantities."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI

from fnserve.adapters.http import routes
from fnserve.observability.envelope import NoTelemetry, RequestRecorder
from tests.helpers import dockerfile_instructions

KUBERNETES = "1.33"  # the schemas' version

IMAGE_ENV = {key: value for line in dockerfile_instructions("ENV") for key, value in re.findall(r"(\w+)=(\S+)", line)}
EXPOSED = {int(port) for line in dockerfile_instructions("EXPOSE") for port in line.split()}
USER = int(dockerfile_instructions("USER")[-1])
CMD = json.loads(dockerfile_instructions("CMD")[-1])
HEALTHCHECK_START = int(re.search(r"--start-period=(\d+)s", dockerfile_instructions("HEALTHCHECK")[0])[1])
# The image sets no HTTP port, so that a platform's PORT holds; its HEALTHCHECK names the default.
HTTP_PORT = int(re.search(r"PORT:-(\d+)\}", dockerfile_instructions("HEALTHCHECK")[0])[1])


def strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever it lists properties and keeps no unknown fields."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


class Catalog:
    """Just enough of a data plane's catalog for the health routes: whether every model can serve."""

    def __init__(self, ready: bool) -> None:
        self.is_ready = ready

    def ready(self) -> bool:
        return self.is_ready


def app(ready: bool) -> FastAPI:
    """fnserve serve's HTTP app, its models loaded (ready) or not."""
    recorder = RequestRecorder("http", NoTelemetry(), access_log=False)
    inference = SimpleNamespace(plane=SimpleNamespace(catalog=Catalog(ready)), default_model=None, recorder=recorder)
    return routes.build(inference, metrics=lambda: b"")


def get_paths(application: FastAPI) -> set[str]:
    return {route.path for route in application.routes if "GET" in getattr(route, "methods", ())}


QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
SUFFIXES |= {f"{s}i": 1024.0 ** (n + 1) for n, s in enumerate("KMGTPE")}


def quantity(value: str | int) -> float:
    """A resource quantity's value: the schemas take any string, the API server only these."""
    match = QUANTITY.fullmatch(str(value))
    assert match, f"{value!r} is not a Kubernetes quantity"
    number, suffix = match.groups()
    if suffix and suffix[0] in "eE":
        return float(number + suffix)
    return float(number) * SUFFIXES.get(suffix or "", 1.0)
