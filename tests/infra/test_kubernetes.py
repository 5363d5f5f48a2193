"""infra/kubernetes/, validated offline: core kinds against Kubernetes' own OpenAPI schemas (kubernetes-validate,
which bundles them), KServe's kinds against the CRD schemas of KServe v0.20.0 (tests/data/kserve), both strict:
a field the schema does not know is an error (the API server would drop it in silence). Then the facts that tie
the manifests to the image and to fnserve: the image's ports, user, command and environment
(infra/container/Dockerfile), the routes the probes call on fnserve's own app, the runtime the services name."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient

from tests.helpers import REPO, dockerfile_instructions
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

KSERVE = REPO / "tests" / "data" / "kserve"
ROOT = REPO / "infra" / "kubernetes"
FILES = sorted(p for p in ROOT.rglob("*.yaml") if p.name != "kustomization.yaml")
DOCUMENTS = [(path, doc) for path in FILES for doc in yaml.safe_load_all(path.read_text()) if doc]
GPU = "nvidia.com/gpu"


def ids(item: tuple[Path, dict[str, Any]]) -> str:
    path, doc = item
    return f"{path.relative_to(ROOT)}:{doc['kind']}/{doc['metadata']['name']}"


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCUMENTS if doc["kind"] == kind]


# -- the image, as infra/container/Dockerfile builds it ----------------------------------------------


def test_the_image_is_what_these_checks_assume() -> None:
    assert json.loads(dockerfile_instructions("ENTRYPOINT")[0]) == ["fnserve"] and CMD == ["serve"]
    assert {HTTP_PORT, int(IMAGE_ENV["FNSERVE_GRPC_PORT"])} <= EXPOSED
    assert USER != 0


# -- schemas ---------------------------------------------------------------------------------------------


@cache
def kserve_validator(kind: str, version: str) -> Any:
    """One validator per CRD: checking the InferenceService schema itself takes seconds, validating against it not."""
    path = KSERVE / f"{kind.lower()}-{version}.schema.json.gz"
    schema = strict(json.loads(gzip.decompress(path.read_bytes())))
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


def validate(doc: dict[str, Any]) -> None:
    group, _, version = doc["apiVersion"].rpartition("/")
    if group == "serving.kserve.io":
        kserve_validator(doc["kind"], version).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_there_is_a_kserve_runtime_and_service_and_a_plain_deployment_service_autoscaler_and_budget() -> None:
    kinds = {doc["kind"] for _, doc in DOCUMENTS}
    assert {"ServingRuntime", "InferenceService", "Deployment", "Service", "HorizontalPodAutoscaler"} <= kinds
    assert "PodDisruptionBudget" in kinds


@pytest.mark.parametrize("item", DOCUMENTS, ids=ids)
def test_every_document_validates_against_its_schema(item: tuple[Path, dict[str, Any]]) -> None:
    validate(item[1])


@pytest.mark.parametrize(
    ("kind", "mistake"),
    [
        ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={})),
        ("Deployment", lambda d: d["spec"].update(replicas="two")),
        ("ServingRuntime", lambda d: d["spec"]["containers"][0].update(imagePullPolice="Always")),
        ("ServingRuntime", lambda d: d["spec"].pop("containers")),
        ("InferenceService", lambda d: d["spec"]["predictor"].update(minReplica=1)),
        ("InferenceService", lambda d: d["spec"]["predictor"].update(scaleMetric="gpu")),
        ("InferenceService", lambda d: d["spec"]["predictor"].update(timeout="600")),  # seconds, an integer
        ("HorizontalPodAutoscaler", lambda d: d["spec"].pop("scaleTargetRef")),
    ],
)
def test_a_mistake_in_a_manifest_fails_validation(kind: str, mistake: Any) -> None:
    doc = json.loads(json.dumps(of_kind(kind)[0]))
    mistake(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc)


def test_each_kustomization_lists_the_files_beside_it() -> None:
    for path in ROOT.rglob("kustomization.yaml"):
        listed = yaml.safe_load(path.read_text())["resources"]
        assert sorted(listed) == sorted(p.name for p in path.parent.glob("*.yaml") if p != path), path


# -- the containers against the image and fnserve's routes ------------------------------------------------


def containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every container that runs the image: its owner's name, the container, and its pod spec."""
    found = []
    for _, doc in DOCUMENTS:
        spec = doc["spec"]
        pod = spec.get("template", {}).get("spec", spec)  # a Deployment's pod template, or a runtime's spec
        for container in pod.get("containers", []):
            found.append((f"{doc['kind']}/{doc['metadata']['name']}", container, pod))
    return found


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as fnserve sees it: the image's ENV, then the container's own."""
    return IMAGE_ENV | {e["name"]: e["value"] for e in container.get("env", [])}


def http_port(container: dict[str, Any]) -> int:
    """The port `fnserve serve` listens on in this container: FNSERVE_PORT, else PORT, else the image's default."""
    env = environment(container)
    return int(env.get("FNSERVE_PORT", env.get("PORT", HTTP_PORT)))


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port, by number or by the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def test_there_are_containers_for_the_cpu_and_cuda_images() -> None:
    images = {container["image"].rpartition(":")[2] for _, container, _ in containers()}
    assert {"cpu", "cuda"} <= images


@pytest.mark.parametrize("item", containers(), ids=lambda item: item[0])
def test_a_container_runs_the_image_as_it_runs_itself(item: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    _, container, pod = item
    assert container["args"] == CMD and "command" not in container  # the image's ENTRYPOINT is fnserve
    env = environment(container)
    declared = {p["containerPort"] for p in container["ports"]}
    assert declared <= EXPOSED
    assert http_port(container) in declared
    assert int(env["FNSERVE_GRPC_PORT"]) in EXPOSED
    context = pod.get("securityContext", {}) | container["securityContext"]  # the container's own wins
    assert context["runAsUser"] == USER and context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("item", containers(), ids=lambda item: item[0])
def test_the_probes_call_fnserves_health_routes_on_its_http_port(
    item: tuple[str, dict[str, Any], dict[str, Any]],
) -> None:
    _, container, _ = item
    http = http_port(container)
    loading, loaded = TestClient(app(ready=False)), TestClient(app(ready=True))
    probes = {name: container[name]["httpGet"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    for name, probe in probes.items():
        assert probe["path"] in get_paths(app(ready=True)), f"{name}: fnserve serve has no GET {probe['path']}"
        assert port_number(container, probe["port"]) == http, name
        assert loaded.get(probe["path"]).status_code == 200, name
    # Not ready keeps traffic away; it must not restart the pod (a model that cannot load yet, or a
    # reload): liveness and startup answer 200 from a server whose models are not ready.
    assert loading.get(probes["readinessProbe"]["path"]).status_code == 503
    assert loading.get(probes["livenessProbe"]["path"]).status_code == 200
    assert loading.get(probes["startupProbe"]["path"]).status_code == 200
    # Until its models have loaded, the port answers 503 to every path (fnserve.server.starting): the
    # startup probe gives a start at least the time the image's own HEALTHCHECK does.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= HEALTHCHECK_START


def read_only() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [item for item in containers() if item[1]["securityContext"].get("readOnlyRootFilesystem")]


def test_the_cpu_containers_have_a_read_only_root() -> None:
    assert {name for name, container, _ in read_only()} >= {"Deployment/fnserve", "ServingRuntime/fnserve"}


@pytest.mark.parametrize("item", read_only(), ids=lambda item: item[0])
def test_a_read_only_root_leaves_fnserve_its_writable_folders(
    item: tuple[str, dict[str, Any], dict[str, Any]],
) -> None:
    _, container, pod = item
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    writable = [
        PurePosixPath(mount["mountPath"])
        for mount in container["volumeMounts"]
        if not mount.get("readOnly") and "emptyDir" in volumes[mount["name"]]
    ]
    # tempfile's folder (metrics of the front processes, CPU slot locks) and the cache of fetched models
    for folder in ("/tmp", environment(container)["FNSERVE_MODEL_CACHE_DIR"]):
        assert any(PurePosixPath(folder).is_relative_to(mount) for mount in writable), folder


def test_prometheus_scrapes_fnserves_metrics_route_on_its_http_port() -> None:
    assert "/metrics" in get_paths(app(ready=True))
    annotated = [(doc["spec"]["template"]["metadata"]["annotations"], "prometheus.io") for doc in of_kind("Deployment")]
    annotated += [(doc["spec"]["annotations"], "prometheus.kserve.io") for doc in of_kind("ServingRuntime")]
    for scrape, prefix in annotated:
        assert scrape[f"{prefix}/port"] == str(HTTP_PORT)
        assert scrape[f"{prefix}/path"] == "/metrics"


def resource_blocks() -> list[tuple[str, dict[str, Any]]]:
    blocks = [(name, container["resources"]) for name, container, _ in containers()]
    blocks += [
        (f"InferenceService/{doc['metadata']['name']}", doc["spec"]["predictor"]["model"]["resources"])
        for doc in of_kind("InferenceService")
        if "resources" in doc["spec"]["predictor"]["model"]
    ]
    return blocks


@pytest.mark.parametrize("item", resource_blocks(), ids=lambda item: item[0])
def test_resources_are_quantities_with_requests_within_limits(item: tuple[str, dict[str, Any]]) -> None:
    _, resources = item
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for resource, request in requests.items():
        if resource in limits:
            assert quantity(request) <= quantity(limits[resource]), resource
        if "/" in resource:  # an extended resource (a GPU) is never overcommitted: the API server wants them equal
            assert quantity(request) == quantity(limits.get(resource, -1)), resource
    for limit in limits.values():
        quantity(limit)


# -- KServe -------------------------------------------------------------------------------------------------


def test_the_runtimes_read_the_manifest_where_kserves_storage_initializer_puts_the_model() -> None:
    for runtime in of_kind("ServingRuntime"):
        for container in runtime["spec"]["containers"]:
            assert environment(container)["FNSERVE_MANIFEST"] == "/mnt/models/manifest.toml"


def test_a_runtime_that_asks_for_a_gpu_runs_the_cuda_image() -> None:
    for runtime in of_kind("ServingRuntime"):
        container = runtime["spec"]["containers"][0]
        gpus = container.get("resources", {}).get("limits", {}).get(GPU)
        assert bool(gpus) == container["image"].endswith(":cuda"), runtime["metadata"]["name"]


def test_the_inference_services_name_a_runtime_that_serves_their_format_and_protocol() -> None:
    runtimes = {doc["metadata"]["name"]: doc["spec"] for doc in of_kind("ServingRuntime")}
    for service in of_kind("InferenceService"):
        name, predictor = service["metadata"]["name"], service["spec"]["predictor"]
        model = predictor["model"]
        runtime = runtimes[model["runtime"]]
        assert model["modelFormat"]["name"] in {f["name"] for f in runtime["supportedModelFormats"]}, name
        assert model["protocolVersion"] in runtime["protocolVersions"], name
        container = runtime["containers"][0]
        gpus = model.get("resources", {}).get("limits", {}).get(GPU)
        assert bool(gpus) == container["image"].endswith(":cuda"), name  # a GPU needs the CUDA variant
        if model["protocolVersion"] == "grpc-v2":  # Standard mode makes a Service port of each container port
            grpc = int(environment(container)["FNSERVE_GRPC_PORT"])
            assert grpc in {p["containerPort"] for p in model["ports"]}, name
        for port in model.get("ports", []):
            assert port["containerPort"] in EXPOSED, name
        assert model["storageUri"].startswith(("s3://", "gs://", "pvc://", "https://")), name


def deployment_mode(service: dict[str, Any]) -> str:
    return str(service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"])


def test_each_inference_service_names_its_mode_and_there_are_both() -> None:
    modes = [deployment_mode(service) for service in of_kind("InferenceService")]
    assert set(modes) == {"Standard", "Knative"}  # KServe 0.20's names ("RawDeployment" and "Serverless" before)


def test_the_standard_mode_services_scale_between_replicas_on_cpu() -> None:
    for service in of_kind("InferenceService"):
        if deployment_mode(service) == "Standard":
            name, predictor = service["metadata"]["name"], service["spec"]["predictor"]
            assert 1 <= predictor["minReplicas"] < predictor["maxReplicas"], name
            assert predictor["scaleMetric"] == "cpu" and 0 < predictor["scaleTarget"] <= 100, name


# Knative Serving's own rules for a revision's serving container (pkg/apis/serving/k8s_validation.go), which KServe's
# Knative mode makes of the runtime's container: one port, named for its protocol, none of the queue-proxy's; the
# variables Knative sets; mount paths it keeps.
KNATIVE_PORT_NAMES = {"http1", "h2c"}
KNATIVE_RESERVED_PORTS = {8012, 8013, 8022, 9090, 9091, 8008}
KNATIVE_RESERVED_ENV = {"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}
KNATIVE_RESERVED_PATHS = {"/", "/dev", "/dev/log"}
# The longest a revision's timeoutSeconds may be: config-defaults' max-revision-timeout-seconds, unless raised.
KNATIVE_MAX_TIMEOUT = 600


def knative_checks(service: dict[str, Any], runtimes: dict[str, dict[str, Any]]) -> None:
    """What a KServe service in Knative mode needs to scale to zero and to wake: the facts, as assertions."""
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert predictor["minReplicas"] == 0 < predictor["maxReplicas"]
    # Knative's autoscaler counts requests in flight (or per second), and never sends a pod more than
    # containerConcurrency: a target above that could never be reached.
    assert predictor["scaleMetric"] in ("concurrency", "rps") and predictor["scaleTarget"] >= 1
    assert predictor["scaleTarget"] <= predictor.get("containerConcurrency", predictor["scaleTarget"])
    # Knative routes one port, the runtime's HTTP one: V2 REST, no gRPC port added beside it.
    assert model["protocolVersion"] == "v2" and "ports" not in model
    container = runtimes[model["runtime"]]["containers"][0]
    assert len(container["ports"]) == 1
    port = container["ports"][0]
    assert port["name"] in KNATIVE_PORT_NAMES and port["containerPort"] not in KNATIVE_RESERVED_PORTS
    assert port["containerPort"] == http_port(container)
    assert not {e["name"] for e in container.get("env", [])} & KNATIVE_RESERVED_ENV
    # The runtime's gRPC server, which Knative cannot route, is turned off, and a pod started for a waiting
    # request starts fast.
    env = {e["name"]: e["value"] for e in model.get("env", [])}
    assert env.get("FNSERVE_GRPC_PORT") == "off" and env.get("FNSERVE_FAST_START") == "true"
    assert not {str(PurePosixPath(m["mountPath"])) for m in container.get("volumeMounts", [])} & KNATIVE_RESERVED_PATHS
    # While no pod runs, the activator holds a request until one is ready, within the revision's timeout (which
    # KServe sets from `timeout`): the wait covers a start as long as the runtime's startup probe allows.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] <= predictor["timeout"] <= KNATIVE_MAX_TIMEOUT
    # The queue-proxy retries its readiness probe until ready only at periodSeconds 0 (knative/serving's
    # pkg/queue/readiness/probe.go, IsAggressive); at any other period it waits that long between probes, added to
    # the start. Beside a 0 its webhook refuses failureThreshold and timeoutSeconds (validateReadinessProbe).
    readiness = container["readinessProbe"]
    assert readiness["periodSeconds"] == 0 and not {"failureThreshold", "timeoutSeconds"} & set(readiness)


def knative_services() -> list[dict[str, Any]]:
    return [service for service in of_kind("InferenceService") if deployment_mode(service) == "Knative"]


def runtimes_by_name() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc["spec"] for doc in of_kind("ServingRuntime")}


@pytest.mark.parametrize("service", knative_services(), ids=lambda service: service["metadata"]["name"])
def test_a_knative_mode_service_scales_to_zero_on_concurrency_and_waits_out_a_cold_start(
    service: dict[str, Any],
) -> None:
    knative_checks(service, runtimes_by_name())


def test_there_is_a_cpu_and_a_gpu_service_in_knative_mode() -> None:
    runtimes = {name: spec["containers"][0]["image"].rpartition(":")[2] for name, spec in runtimes_by_name().items()}
    assert {runtimes[service["spec"]["predictor"]["model"]["runtime"]] for service in knative_services()} == {
        "cpu",
        "cuda",
    }


def runtime_of(service: dict[str, Any], runtimes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return runtimes[service["spec"]["predictor"]["model"]["runtime"]]["containers"][0]


@pytest.mark.parametrize(
    "mistake",
    [
        lambda s, r: s["spec"]["predictor"].update(minReplicas=1),  # never scales to zero
        lambda s, r: s["spec"]["predictor"].update(scaleMetric="cpu"),  # the HPA's metric, not Knative's
        lambda s, r: s["spec"]["predictor"].update(scaleTarget=64),  # above containerConcurrency
        lambda s, r: s["spec"]["predictor"].update(timeout=60),  # shorter than a cold start may take
        lambda s, r: s["spec"]["predictor"].update(timeout=900),  # above Knative's default maximum
        lambda s, r: s["spec"]["predictor"]["model"].update(protocolVersion="grpc-v2"),
        lambda s, r: s["spec"]["predictor"]["model"].update(ports=[{"name": "h2c", "containerPort": 8081}]),
        lambda s, r: runtime_of(s, r)["ports"].append({"name": "h2c", "containerPort": 8081}),
        lambda s, r: runtime_of(s, r)["env"].append({"name": "PORT", "value": "8080"}),
        lambda s, r: s["spec"]["predictor"]["model"].pop("env"),  # gRPC on, and a start that times layouts
        lambda s, r: runtime_of(s, r)["readinessProbe"].update(periodSeconds=5),  # probed every 5 s
        lambda s, r: runtime_of(s, r)["readinessProbe"].update(failureThreshold=3),  # refused by Knative
    ],
)
def test_a_mistake_in_a_knative_mode_service_fails_its_checks(mistake: Any) -> None:
    service, runtimes = json.loads(json.dumps((knative_services()[0], runtimes_by_name())))
    mistake(service, runtimes)
    with pytest.raises(AssertionError):
        knative_checks(service, runtimes)


# -- the plain Deployment --------------------------------------------------------------------------------------


def test_the_service_autoscaler_and_budget_cover_the_deployments_pods() -> None:
    docs = {doc["kind"]: doc for _, doc in DOCUMENTS if doc["metadata"]["name"] == "fnserve"}
    deployment, service, hpa, budget = (
        docs[kind] for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget")
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = environment(container)
    by_number = {port_number(container, p["targetPort"]): p for p in service["spec"]["ports"]}
    assert by_number[http_port(container)]["appProtocol"] == "http"
    assert by_number[int(env["FNSERVE_GRPC_PORT"])]["appProtocol"] in ("kubernetes.io/h2c", "grpc")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "fnserve"}
    assert "replicas" not in deployment["spec"]  # the HPA's to set: an apply would reset it
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert container["resources"]["requests"]["cpu"]  # CPU utilisation is measured against the request
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] > 0  # new replicas load models
    # A budget that the HPA's minimum cannot exceed would block every node drain.
    assert budget["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


@pytest.mark.parametrize("item", containers(), ids=lambda item: item[0])
def test_a_container_asks_callers_for_the_keys_of_a_mounted_secret_and_leaves_its_probes_open(
    item: tuple[str, dict[str, Any], dict[str, Any]],
) -> None:
    """No mesh in front: fnserve's own API keys, from a Secret volume (updated in place, so keys rotate with no
    restart); the probes and the scrape need none, or the kubelet and Prometheus would be refused."""
    from fnserve.adapters.http.gate import Gate
    from fnserve.adapters.http.table import route_of
    from fnserve.adapters.keys import ApiKeys

    _, container, pod = item
    path = PurePosixPath(environment(container)["FNSERVE_API_KEYS_FILE"])
    [mount] = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] is True and volume["secret"]["secretName"] == "fnserve-api-keys"
    assert path.name == "keys"  # the key the Secret holds them under, as the comment beside it creates it
    gate = Gate(ApiKeys(lambda: ["fns-0123456789abcdef"], "test"))
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        route = route_of("GET", container[name]["httpGet"]["path"])
        assert route is not None and route.endpoint in gate.open, name
    assert route_of("GET", "/metrics").endpoint in gate.open  # type: ignore[union-attr]
