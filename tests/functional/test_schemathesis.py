"""Property-based API tests: schemathesis against the OIP spec and against fnserve's own OpenAPI.

No generated request may produce a 5xx or a response that violates the documented schema.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance, response_schema_conformance

from fnserve.adapters.http.app import create_app
from fnserve.core.execution.service import InferenceService
from fnserve.core.serving.dataplane import DataPlane
from fnserve.settings import Settings
from tests.helpers import write_test_manifest

SPEC = Path(__file__).parent / "specs" / "open_inference_rest.yaml"
MODELS = ["digits-fast", "digits-accurate", "identity"]


def _app(tmp: Path) -> Any:
    manifest = write_test_manifest(tmp)
    service = InferenceService.from_manifest(manifest, eager=True)
    return create_app(DataPlane(service), Settings(manifest=manifest, access_log=False))


def _oip_schema() -> dict[str, Any]:
    """The spec with its ${MODEL_NAME}-style placeholders made real path parameters over our models."""
    text = SPEC.read_text().replace("${MODEL_NAME}", "{MODEL_NAME}").replace("${MODEL_VERSION}", "{MODEL_VERSION}")
    spec = yaml.safe_load(text)
    for item in spec["paths"].values():
        for param in item.get("parameters", []):
            if param["name"] == "MODEL_NAME":
                param["schema"] = {"type": "string", "enum": MODELS}
            elif param["name"] == "MODEL_VERSION":
                param["schema"] = {"type": "string", "enum": ["1"]}
    return spec  # type: ignore[no-any-return]


_TMP = Path(tempfile.mkdtemp(prefix="fnserve-schemathesis-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
APP = _app(_TMP)
oip = schemathesis.openapi.from_dict(_oip_schema())
oip.app = APP


@schemathesis.serializer("application/x-npy", "application/x-npz")
def numpy_body(ctx: Any, value: Any) -> bytes:
    """SageMaker's NumPy bodies: generated as binary strings, sent as they are (mostly not valid .npy: a 400)."""
    return value if isinstance(value, bytes) else str(value).encode()


own = schemathesis.openapi.from_asgi("/openapi.json", APP)

# Derandomized: CI explores the same examples every run (a new one is found by raising max_examples locally).
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@oip.parametrize()
@SETTINGS
def test_oip_spec_no_server_errors_no_schema_violations(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])


@own.parametrize()
@SETTINGS
def test_own_openapi_conformance(case: schemathesis.Case) -> None:
    # A schema-valid infer body may still not fit the model (shape, dtype): 422 is right there.
    excluded = [positive_data_acceptance] if case.operation.path.endswith(("/infer", "/invocations")) else []
    case.call_and_validate(excluded_checks=excluded)


def test_own_openapi_documents_every_v2_route() -> None:
    paths = set(APP.fastapi().openapi()["paths"])
    assert {
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/{name}",
        "/v2/models/{name}/versions/{version}",
        "/v2/models/{name}/ready",
        "/v2/models/{name}/versions/{version}/ready",
        "/v2/models/{name}/infer",
        "/v2/models/{name}/versions/{version}/infer",
    } <= paths


pytestmark = pytest.mark.slow
