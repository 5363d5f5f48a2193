"""The memory the demo manifest's processes need, against what each shipped target gives them: each front process at
its steady state, the MiniLM token budget's working memory, and a request of the most texts it takes, times the
processes a target runs (one per CPU of its limit). docs/design/memory.md gives the figures and the commands that
measure them; a target that could not hold them would be killed by its platform with every request in flight."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.helpers import REPO

PROCESS_MB = 200  # a front process with the demo's models loaded and warm (bench_ingest_mix: RSS at start)
BUDGET_MB = 30  # MiniLM's runs within its budget of 1,024 tokens and 32,768 attention scores (bench_memory)
REQUEST_MB = 100  # a request of 1,000 texts of 256 tokens in flight: its body, tokens and answer (test_request_memory)
NEEDED_MB = PROCESS_MB + BUDGET_MB + REQUEST_MB


def mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Gi|Mi)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * (1024 if unit == "Gi" else 1)


def limits(doc: Any) -> list[dict[str, str]]:
    """Every container resource ``limits`` in a Kubernetes-shaped document."""
    found = []
    if isinstance(doc, dict):
        if isinstance(doc.get("limits"), dict) and "memory" in doc["limits"]:
            found.append(doc["limits"])
        for value in doc.values():
            found += limits(value)
    elif isinstance(doc, list):
        for value in doc:
            found += limits(value)
    return found


def cfn_default(path: str, parameter: str) -> int:
    text = (REPO / path).read_text()
    match = re.search(rf"^  {parameter}:\n(?:    .*\n)*?    Default: (\d+)", text, re.M)
    assert match is not None, f"{parameter} has no default in {path}"
    return int(match.group(1))


KUBERNETES = [
    "infra/gcp/cloudrun/service.yaml",
    "infra/kubernetes/deployment/fnserve.yaml",
    "infra/kubernetes/kserve/servingruntime.yaml",
]


@pytest.mark.parametrize("path", KUBERNETES)
def test_each_container_limit_holds_its_front_processes_budget_and_largest_request(path: str) -> None:
    found = [limit for doc in yaml.safe_load_all((REPO / path).read_text()) for limit in limits(doc)]
    assert found, f"no memory limit in {path}"
    for limit in found:
        fronts = max(1, int(float(limit.get("cpu", "1"))))  # one front process per CPU of the limit
        assert fronts * NEEDED_MB <= mib(limit["memory"]), f"{path}: {fronts} x {NEEDED_MB} MB over {limit}"


def test_the_lambda_api_function_and_sagemaker_serverless_hold_them() -> None:
    assert NEEDED_MB <= cfn_default("template.yaml", "ApiMemorySize")  # one process a container
    # SageMaker Serverless: the container's server on its two CPUs (docs/sagemaker.md), two front processes.
    assert 2 * NEEDED_MB <= cfn_default("infra/container/sagemaker.yaml", "ServerlessMemorySizeInMB")
