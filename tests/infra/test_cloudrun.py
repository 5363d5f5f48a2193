"""infra/gcp/cloudrun/, validated offline. Each service against Cloud Run's own schema for what `gcloud run services
replace` sends (the Cloud Run Admin API v1 discovery document, tests/data/cloudrun), strict: a field it does not
know is an error; its annotations against those that document accepts on a service and on a revision; its pod
part against Kubernetes' core schema. Then the facts that tie it to the image and to fnserve: `fnserve serve`
listens on the port Cloud Run gives, the probes call fnserve's own health routes, the models are where the image
can read them, it scales to zero, and the GPU service asks for one L4 and runs the CUDA image."""

from __future__ import annotations

import gzip
import json
import re
import socket
from collections.abc import Callable
from functools import cache
from pathlib import PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml
from fastapi.testclient import TestClient

from fnserve.cli import app as cli
from fnserve.server.starting import not_ready_until_loaded
from fnserve.settings import ServerSettings
from tests.helpers import REPO
from tests.helpers.deploy import (
    CMD,
    EXPOSED,
    HEALTHCHECK_START,
    HTTP_PORT,
    IMAGE_ENV,
    KUBERNETES,
    USER,
    app,
    get_paths,
    quantity,
    strict,
)
from tests.moto import free_port

ROOT = REPO / "infra" / "gcp" / "cloudrun"
SERVICES = {path.name: yaml.safe_load(path.read_text()) for path in sorted(ROOT.glob("*.yaml"))}
DISCOVERY = REPO / "tests" / "data" / "cloudrun" / "run-v1.json.gz"
GPU = "nvidia.com/gpu"
ACCELERATOR = "run.googleapis.com/accelerator"
# Cloud Run's documented bounds: a startup probe's window (failureThreshold x periodSeconds), a request's
# timeout, an instance's concurrency, and what an instance with an L4 must have at least.
STARTUP_WINDOW_MAX = 240
TIMEOUT_MAX = 3600
CONCURRENCY_MAX = 1000
L4_MINIMUM = {"cpu": 4.0, "memory": 16 * 1024.0**3}
# Knative's runtime contract, which Cloud Run keeps: the variables the platform sets.
RESERVED_ENV = {"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}
# The Python packages a manifest's scheme needs in the image.
SCHEME_PACKAGES = {"gs": "google-cloud-storage", "s3": "boto3"}


def template(service: Any) -> Any:
    """The revision template: its annotations and its spec."""
    return service["spec"]["template"]


def the_container(service: Any) -> Any:
    (container,) = template(service)["spec"]["containers"]  # one container: the one Cloud Run routes to
    return container


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as fnserve sees it: the image's ENV, then the container's own."""
    return IMAGE_ENV | {e["name"]: e["value"] for e in container.get("env", [])}


def test_there_is_a_cpu_and_a_gpu_service() -> None:
    images = {name: the_container(service)["image"] for name, service in SERVICES.items()}
    assert {name: image.rpartition(":")[2] for name, image in images.items()} == {
        "service.yaml": "cpu",
        "service-gpu.yaml": "cuda",
    }


# -- schemas -----------------------------------------------------------------------------------------------------


@cache
def discovery() -> dict[str, Any]:
    return dict(json.loads(gzip.decompress(DISCOVERY.read_bytes())))


def json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A discovery document's schema as JSON Schema: references to named schemas, 64-bit integers (strings in
    JSON, numbers in YAML) and ``any``."""
    if "$ref" in node:
        return {"$ref": f"#/definitions/{node['$ref']}"}
    if node.get("type") == "any":
        return {}
    if node.get("type") == "string" and node.get("format") in ("int64", "uint64"):
        return {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^-?\d+$"}]}
    schema = {key: node[key] for key in ("type", "enum") if key in node}
    if "properties" in node:  # less those Cloud Run ignores: a field it says it does not support is a mistake too
        schema["properties"] = {
            name: json_schema(value)
            for name, value in node["properties"].items()
            if not value.get("description", "").startswith("Not supported by Cloud Run")
        }
    for key in ("items", "additionalProperties"):
        if key in node:
            schema[key] = json_schema(node[key])
    return schema


@cache
def cloud_run_validator() -> Any:
    definitions = {name: json_schema(schema) for name, schema in discovery()["schemas"].items()}
    schema = strict({"$ref": "#/definitions/Service", "definitions": definitions})
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@cache
def accepted_annotations() -> dict[str, set[str]]:
    """The restricted annotations Cloud Run accepts, each with the resources it accepts it on (Service, Revision,
    ...), as ObjectMeta's description in the discovery document lists them."""
    description = discovery()["schemas"]["ObjectMeta"]["properties"]["annotations"]["description"]
    found = re.findall(r"`((?:run\.googleapis\.com|autoscaling\.knative\.dev)/[^`]+)`: ([A-Za-z, ]+)", description)
    return {name: {kind.strip() for kind in kinds.split(",") if kind.strip()} for name, kinds in found}


def annotation_checks(service: dict[str, Any]) -> None:
    restricted = ("run.googleapis.com/", "autoscaling.knative.dev/")
    for kind, metadata in (("Service", service["metadata"]), ("Revision", template(service)["metadata"])):
        for name in metadata.get("annotations", {}):
            if name.startswith(restricted):
                assert kind in accepted_annotations().get(name, set()), f"Cloud Run takes no {name} on a {kind}"


def pod(service: dict[str, Any]) -> dict[str, Any]:
    """The revision as a Kubernetes Pod: its spec less the fields Knative's RevisionSpec adds to a PodSpec."""
    spec = {
        key: value
        for key, value in template(service)["spec"].items()
        if key not in ("containerConcurrency", "timeoutSeconds")
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": service["metadata"]["name"]}, "spec": spec}


def schema_checks(service: dict[str, Any]) -> None:
    cloud_run_validator().validate(service)
    annotation_checks(service)
    kubernetes_validate.validate(pod(service), KUBERNETES, strict=True)


@pytest.mark.parametrize("name", SERVICES)
def test_a_service_is_what_cloud_run_and_kubernetes_accept(name: str) -> None:
    schema_checks(SERVICES[name])


def test_the_schema_knows_the_fields_and_annotations_these_checks_rely_on() -> None:
    assert accepted_annotations()["autoscaling.knative.dev/minScale"] == {"Revision"}
    assert "Service" in accepted_annotations()["run.googleapis.com/ingress"]
    revision = discovery()["schemas"]["RevisionSpec"]["properties"]
    assert {"containerConcurrency", "timeoutSeconds", "nodeSelector", "serviceAccountName"} <= set(revision)


# -- the container against the image, fnserve's command line and its routes ------------------------------------------


def listening(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """Where `fnserve serve` listens in this container, as its command line parses its environment: the image's
    and the container's variables, and the PORT Cloud Run sets from the container's port."""
    (port,) = container["ports"]
    env = environment(container) | {"PORT": str(port["containerPort"])}
    serve = typer.main.get_command(cli).get_command(None, "serve")
    for param in serve.params:
        for variable in [param.envvar] if isinstance(param.envvar, str) else param.envvar or []:
            monkeypatch.delenv(variable, raising=False)
            if variable in env:
                monkeypatch.setenv(variable, env[variable])
    params = serve.make_context("serve", []).params
    return params["host"], params["port"]


def container_checks(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    container = the_container(service)
    assert container["args"] == CMD and "command" not in container  # the image's ENTRYPOINT is fnserve
    (port,) = container["ports"]  # Cloud Run routes one port, and sets PORT from it
    # The port's name says its protocol: http1, fnserve's HTTP/1.1 (h2c would be end-to-end HTTP/2, and gRPC).
    assert port["name"] == "http1"
    env = environment(container)
    # The image's HTTP port, which it exposes; never its gRPC port (HTTP there would stop the start).
    assert port["containerPort"] == HTTP_PORT and HTTP_PORT in EXPOSED
    # Cloud Run routes one port: the image's gRPC server is turned off, and the start is a fast one.
    assert env["FNSERVE_GRPC_PORT"] == "off" and env["FNSERVE_FAST_START"] == "true"
    assert not {e["name"] for e in container.get("env", [])} & RESERVED_ENV
    host, listens_on = listening(container, monkeypatch)
    assert listens_on == port["containerPort"]
    assert host in ("0.0.0.0", "::")  # Cloud Run's contract: listen on every interface
    # The image's non-root user stays: nothing runs it as root.
    assert USER != 0 and container.get("securityContext", {}).get("runAsUser", USER) != 0


def probe_checks(service: dict[str, Any]) -> None:
    container = the_container(service)
    (port,) = container["ports"]
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    # Cloud Run sends requests once the startup probe passes. Its TCP probe passes as soon as the port accepts, which
    # a fast start's does once its first front process can answer, provided no 503 server holds it meanwhile.
    assert "tcpSocket" in startup, startup
    assert startup["tcpSocket"].get("port", port["containerPort"]) == port["containerPort"]
    setting = environment(container).get("FNSERVE_ANSWER_WHILE_LOADING")
    answer = ServerSettings(**({} if setting is None else {"answer_while_loading": setting})).answer_while_loading
    assert not answer, "a 503 server on the port would pass the TCP probe before the models are loaded"
    where = free_port()
    with not_ready_until_loaded("127.0.0.1", where, answer), socket.socket() as client:
        with pytest.raises(ConnectionRefusedError):  # the port closed while the models load
            client.connect(("127.0.0.1", where))
    # Liveness must not restart an instance whose models are reloading.
    loading, loaded = TestClient(app(ready=False)), TestClient(app(ready=True))
    path = liveness["httpGet"]["path"]
    assert path in get_paths(app(ready=True)), f"fnserve serve has no GET {path}"
    assert liveness["httpGet"].get("port", port["containerPort"]) == port["containerPort"]
    assert loaded.get(path).status_code == 200 and loading.get(path).status_code == 200
    assert liveness.get("timeoutSeconds", 1) < liveness.get("periodSeconds", 10)  # Cloud Run requires it
    # A start gets at least what the image's own HEALTHCHECK gives one, within Cloud Run's limit.
    window = startup["periodSeconds"] * startup["failureThreshold"]
    assert HEALTHCHECK_START <= window <= STARTUP_WINDOW_MAX


def lock_packages() -> set[str]:
    """The Python packages the image holds (its locks; the CUDA variant's adds to the CPU one's)."""
    names: set[str] = set()
    for lock in ("requirements.lock", "requirements-cuda.lock"):
        text = (REPO / "infra" / "container" / lock).read_text()
        names |= {name.lower() for name in re.findall(r"(?m)^([A-Za-z0-9_.-]+)==", text)}
    return names


def model_checks(service: dict[str, Any]) -> None:
    """The manifest is where the image can read it: a gs:// or s3:// one needs that cloud's client in the image, a
    path needs a read-only Cloud Storage volume mounted above it (or the models baked into the image)."""
    spec, container = template(service)["spec"], the_container(service)
    manifest = environment(container)["FNSERVE_MANIFEST"]
    scheme, found, _ = manifest.partition("://")
    if found:
        assert SCHEME_PACKAGES[scheme] in lock_packages(), f"the image cannot read {scheme}:// without its client"
        return
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    mounts = {PurePosixPath(m["mountPath"]): volumes[m["name"]] for m in container.get("volumeMounts", [])}
    above = [volume for path, volume in mounts.items() if PurePosixPath(manifest).is_relative_to(path)]
    if not above:
        assert PurePosixPath(manifest).is_relative_to("/opt/ml/model"), f"nothing holds {manifest}"
        return
    (volume,) = above
    assert volume["csi"]["driver"] == "gcsfuse.run.googleapis.com" and volume["csi"]["readOnly"] is True
    assert volume["csi"]["volumeAttributes"]["bucketName"]
    # Never mounted where fnserve writes: temp files and the cache of fetched models.
    for folder in ("/tmp", environment(container)["FNSERVE_MODEL_CACHE_DIR"]):
        assert not any(PurePosixPath(folder).is_relative_to(path) for path in mounts), folder
    assert template(service)["metadata"]["annotations"]["run.googleapis.com/execution-environment"] == "gen2"


def scaling_checks(service: dict[str, Any]) -> None:
    annotations, spec = template(service)["metadata"]["annotations"], template(service)["spec"]
    assert annotations["autoscaling.knative.dev/minScale"] == "0"  # scale to zero
    assert int(annotations["autoscaling.knative.dev/maxScale"]) >= 1
    assert annotations["run.googleapis.com/startup-cpu-boost"] == "true"  # the models load at start
    assert 1 <= spec["containerConcurrency"] <= CONCURRENCY_MAX
    assert 1 <= spec["timeoutSeconds"] <= TIMEOUT_MAX
    assert spec["serviceAccountName"].endswith(".iam.gserviceaccount.com")


def hardware_checks(service: dict[str, Any]) -> None:
    """The GPU service asks for one L4 and runs the CUDA image; the CPU service asks for no GPU."""
    spec, container = template(service)["spec"], the_container(service)
    limits = container["resources"]["limits"]
    sizes = {resource: quantity(value) for resource, value in limits.items()}  # each a quantity
    if container["image"].endswith(":cuda"):
        assert limits[GPU] == "1" and spec["nodeSelector"] == {ACCELERATOR: "nvidia-l4"}
        assert all(sizes[resource] >= least for resource, least in L4_MINIMUM.items()), sizes
        # A GPU needs instance-based billing: CPU allocated for the instance's life, not only during requests.
        assert template(service)["metadata"]["annotations"].get("run.googleapis.com/cpu-throttling") == "false"
    else:
        assert GPU not in limits and ACCELERATOR not in spec.get("nodeSelector", {})
        assert container["image"].endswith(":cpu")
    assert sizes["cpu"] >= 1 and sizes["memory"] > 0  # fnserve sizes its processes from the CPU limit


@pytest.mark.parametrize("name", SERVICES)
def test_the_container_runs_the_image_on_the_port_cloud_run_gives(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    container_checks(SERVICES[name], monkeypatch)


@pytest.mark.parametrize("name", SERVICES)
def test_the_probes_call_fnserves_health_routes_and_wait_for_the_models(name: str) -> None:
    probe_checks(SERVICES[name])


@pytest.mark.parametrize("name", SERVICES)
def test_the_models_are_where_the_image_can_read_them(name: str) -> None:
    model_checks(SERVICES[name])


@pytest.mark.parametrize("name", SERVICES)
def test_it_scales_to_zero_on_requests(name: str) -> None:
    scaling_checks(SERVICES[name])


@pytest.mark.parametrize("name", SERVICES)
def test_it_asks_for_the_hardware_its_image_needs(name: str) -> None:
    hardware_checks(SERVICES[name])


# -- each check can fail ----------------------------------------------------------------------------------------------


def annotations(service: Any) -> Any:
    """The revision's annotations."""
    return template(service)["metadata"]["annotations"]


def env(service: Any, name: str, value: str) -> None:
    the_container(service)["env"].append({"name": name, "value": value})


CPU, GPU_SERVICE = "service.yaml", "service-gpu.yaml"
# What the files held before: a probe of the readiness route, whose period a started server waited out.
HTTP_STARTUP_PROBE = {
    "httpGet": {"path": "/v2/health/ready", "port": 8080},
    "periodSeconds": 10,
    "failureThreshold": 24,
}
MISTAKES: list[tuple[str, str, Callable[[Any], None]]] = [
    # Cloud Run's schema: a misspelt or misplaced field, a wrong type, a field Cloud Run does not support
    ("schema", CPU, lambda s: the_container(s).update(readinesProbe={})),
    ("schema", CPU, lambda s: template(s)["spec"].update(containerConcurency=16)),
    ("schema", CPU, lambda s: template(s)["spec"].update(containerConcurrency="16")),
    ("schema", CPU, lambda s: template(s)["spec"]["volumes"][0]["csi"].update(bucket="BUCKET")),
    ("schema", CPU, lambda s: template(s)["spec"].update(enableServiceLinks=False)),
    # an annotation Cloud Run does not take, or not there
    ("schema", CPU, lambda s: annotations(s).update({"autoscaling.knative.dev/target": "8"})),
    ("schema", CPU, lambda s: annotations(s).update({"run.googleapis.com/ingress": "all"})),
    ("schema", CPU, lambda s: s["metadata"]["annotations"].update({"autoscaling.knative.dev/minScale": "0"})),
    # Kubernetes' core schema: a probe with no port
    ("schema", CPU, lambda s: the_container(s)["livenessProbe"]["httpGet"].pop("port")),
    # the container
    ("container", CPU, lambda s: the_container(s)["ports"][0].update(containerPort=9090)),
    ("container", CPU, lambda s: the_container(s)["ports"][0].update(containerPort=8081)),
    ("container", CPU, lambda s: the_container(s)["ports"][0].update(name="h2c")),
    ("container", CPU, lambda s: env(s, "PORT", "8080")),
    ("container", CPU, lambda s: env(s, "FNSERVE_PORT", "9000")),
    ("container", CPU, lambda s: env(s, "FNSERVE_HOST", "127.0.0.1")),
    ("container", CPU, lambda s: env(s, "FNSERVE_GRPC_PORT", "8081")),
    ("container", CPU, lambda s: env(s, "FNSERVE_FAST_START", "false")),
    ("container", CPU, lambda s: the_container(s).update(securityContext={"runAsUser": 0})),
    # the probes
    ("probes", CPU, lambda s: the_container(s).update(startupProbe=HTTP_STARTUP_PROBE)),
    ("probes", CPU, lambda s: env(s, "FNSERVE_ANSWER_WHILE_LOADING", "true")),
    ("probes", CPU, lambda s: the_container(s)["startupProbe"]["tcpSocket"].update(port=8081)),
    ("probes", CPU, lambda s: the_container(s)["livenessProbe"]["httpGet"].update(path="/v2/health/ready")),
    ("probes", CPU, lambda s: the_container(s)["startupProbe"].update(failureThreshold=30)),
    ("probes", CPU, lambda s: the_container(s)["startupProbe"].update(periodSeconds=10)),
    ("probes", CPU, lambda s: the_container(s)["livenessProbe"].update(timeoutSeconds=10)),
    # the models
    ("models", CPU, lambda s: env(s, "FNSERVE_MANIFEST", "gs://BUCKET/fnserve/models/manifest.toml")),
    ("models", CPU, lambda s: env(s, "FNSERVE_MANIFEST", "/srv/models/manifest.toml")),
    ("models", CPU, lambda s: template(s)["spec"]["volumes"][0]["csi"].update(readOnly=False)),
    ("models", CPU, lambda s: env(s, "FNSERVE_MODEL_CACHE_DIR", "/mnt/bucket/cache")),
    # scaling
    ("scaling", CPU, lambda s: annotations(s).update({"autoscaling.knative.dev/minScale": "1"})),
    ("scaling", CPU, lambda s: template(s)["spec"].update(containerConcurrency=0)),
    # the hardware
    ("hardware", GPU_SERVICE, lambda s: the_container(s)["resources"]["limits"].update({GPU: "2"})),
    ("hardware", GPU_SERVICE, lambda s: template(s)["spec"].update(nodeSelector={ACCELERATOR: "nvidia-t4"})),
    ("hardware", GPU_SERVICE, lambda s: the_container(s)["resources"]["limits"].update(memory="8Gi")),
    ("hardware", GPU_SERVICE, lambda s: annotations(s).pop("run.googleapis.com/cpu-throttling")),
    ("hardware", GPU_SERVICE, lambda s: the_container(s).update(image=the_container(s)["image"][:-4] + "cpu")),
    ("hardware", CPU, lambda s: the_container(s)["resources"]["limits"].update({GPU: "1"})),
]
CHECKS: dict[str, Callable[..., None]] = {
    "schema": schema_checks,
    "container": container_checks,
    "probes": probe_checks,
    "models": model_checks,
    "scaling": scaling_checks,
    "hardware": hardware_checks,
}


@pytest.mark.parametrize(("check", "name", "mistake"), MISTAKES)
def test_a_mistake_in_a_service_fails_its_check(
    check: str, name: str, mistake: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = json.loads(json.dumps(SERVICES[name]))
    mistake(service)
    arguments = (service, monkeypatch) if check == "container" else (service,)
    with pytest.raises((AssertionError, jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        CHECKS[check](*arguments)
