"""infra/kubernetes/, validated offline: core kinds against Kubernetes' own OpenAPI schemas (kubernetes-validate,
which bundles them), KServe's kinds against the CRD schemas of KServe v0.20.0 (tests/data/kserve), both strict:
a field the schema does not know is an error (the API server would drop it in silence). Then the facts that tie
the manifests to the image: its ports, its user, the routes the probes call, the runtime the services name."""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helpers import REPO

KUBERNETES = "1.33"
KSERVE = REPO / "tests" / "data" / "kserve"
ROOT = REPO / "infra" / "kubernetes"
FILES = sorted(p for p in ROOT.rglob("*.yaml") if p.name != "kustomization.yaml")
DOCUMENTS = [(path, doc) for path in FILES for doc in yaml.safe_load_all(path.read_text()) if doc]
DOCKERFILE = (REPO / "infra" / "container" / "Dockerfile").read_text()


def ids(item: tuple[Path, dict[str, Any]]) -> str:
    path, doc = item
    return f"{path.relative_to(ROOT)}:{doc['kind']}/{doc['metadata']['name']}"


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


@cache
def kserve_schema(kind: str, version: str) -> dict[str, Any]:
    path = KSERVE / f"{kind.lower()}-{version}.schema.json.gz"
    schema: dict[str, Any] = strict(json.loads(gzip.decompress(path.read_bytes())))
    return schema


def validate(doc: dict[str, Any]) -> None:
    group, _, version = doc["apiVersion"].rpartition("/")
    if group == "serving.kserve.io":
        jsonschema.validate(doc, kserve_schema(doc["kind"], version))
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_there_is_a_kserve_runtime_and_service_and_a_plain_deployment_service_and_autoscaler() -> None:
    kinds = {doc["kind"] for _, doc in DOCUMENTS}
    assert {"ServingRuntime", "InferenceService", "Deployment", "Service", "HorizontalPodAutoscaler"} <= kinds


@pytest.mark.parametrize("item", DOCUMENTS, ids=ids)
def test_every_document_validates_against_its_schema(item: tuple[Path, dict[str, Any]]) -> None:
    validate(item[1])


@pytest.mark.parametrize(
    ("kind", "mistake"),
    [
        ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={})),
        ("Deployment", lambda d: d["spec"].update(replicas="two")),
        ("ServingRuntime", lambda d: d["spec"]["containers"][0].update(imagePullPolice="Always")),
        ("InferenceService", lambda d: d["spec"]["predictor"].update(minReplica=1)),
        ("HorizontalPodAutoscaler", lambda d: d["spec"].pop("scaleTargetRef")),
    ],
)
def test_a_mistake_in_a_manifest_fails_validation(kind: str, mistake: Any) -> None:
    doc = json.loads(json.dumps(next(d for _, d in DOCUMENTS if d["kind"] == kind)))
    mistake(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc)


def test_each_kustomization_lists_the_files_beside_it() -> None:
    for path in ROOT.rglob("kustomization.yaml"):
        listed = yaml.safe_load(path.read_text())["resources"]
        assert sorted(listed) == sorted(p.name for p in path.parent.glob("*.yaml") if p != path), path


def containers() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for _, doc in DOCUMENTS:
        spec = doc["spec"]
        pod = spec.get("template", {}).get("spec", spec)  # a Deployment's pod template, or a runtime's spec
        for container in pod.get("containers", []):
            found.append((f"{doc['kind']}/{doc['metadata']['name']}", container))
    return found


def app_routes() -> set[str]:
    """The GET routes fnserve serve answers (its app, built without a model)."""
    text = (REPO / "layers" / "fnserve" / "fnserve" / "adapters" / "http" / "routes.py").read_text()
    return set(re.findall(r'app\.get\("([^"{]+)"', text))


def test_the_containers_run_the_image_as_it_runs_itself() -> None:
    exposed = {int(port) for port in re.findall(r"(?m)^EXPOSE (.*)$", DOCKERFILE)[0].split()}
    user = int(re.findall(r"(?m)^USER (\d+)$", DOCKERFILE)[-1])
    routes = app_routes()
    assert {"/v2/health/live", "/v2/health/ready", "/ping"} <= routes
    found = containers()
    assert len(found) >= 3
    for name, container in found:
        assert container["args"] == ["serve"], name  # the image's ENTRYPOINT is fnserve
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        ports = {p["containerPort"] for p in container["ports"]}
        assert ports <= exposed, name
        assert int(env.get("FNSERVE_PORT", 8080)) in ports and int(env.get("FNSERVE_GRPC_PORT", 8081)) in exposed
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            path = container[probe]["httpGet"]["path"]
            assert path in routes, f"{name}: {probe} calls {path}, which fnserve serve does not answer"
        assert container[probe]["httpGet"]["port"] in (8080, "http")
        context = container["securityContext"]
        assert context.get("runAsUser", user) == user and context["allowPrivilegeEscalation"] is False, name
        assert context["capabilities"]["drop"] == ["ALL"], name
        if env.get("FNSERVE_MANIFEST"):  # KServe's storage initializer puts the model folder there
            assert env["FNSERVE_MANIFEST"] == "/mnt/models/manifest.toml", name


def test_the_inference_services_name_a_runtime_that_serves_their_format_and_protocol() -> None:
    runtimes = {doc["metadata"]["name"]: doc["spec"] for _, doc in DOCUMENTS if doc["kind"] == "ServingRuntime"}
    services = [doc for _, doc in DOCUMENTS if doc["kind"] == "InferenceService"]
    for service in services:
        model = service["spec"]["predictor"]["model"]
        runtime = runtimes[model["runtime"]]
        formats = {f["name"] for f in runtime["supportedModelFormats"]}
        assert model["modelFormat"]["name"] in formats
        assert model["protocolVersion"] in runtime["protocolVersions"]
        image = runtime["containers"][0]["image"]
        gpus = model.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        assert bool(gpus) == image.endswith(":cuda"), service["metadata"]["name"]  # a GPU needs the CUDA variant
        annotations = service["metadata"]["annotations"]
        assert annotations["serving.kserve.io/deploymentMode"] == "Standard"
        assert service["spec"]["predictor"]["maxReplicas"] > service["spec"]["predictor"]["minReplicas"]


def test_the_autoscaler_scales_the_deployment_the_service_fronts() -> None:
    docs = {doc["kind"]: doc for _, doc in DOCUMENTS if doc["metadata"]["name"] == "fnserve"}
    deployment, service, hpa = docs["Deployment"], docs["Service"], docs["HorizontalPodAutoscaler"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "fnserve"}
    assert hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["requests"]["cpu"]  # CPU utilisation needs a request
    named = {p["name"] for p in pod["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= named
