"""infra/container/sagemaker.yaml's Mode=serverless (SageMaker Serverless Inference), checked on the template.

cfn-lint checks the schemas; these check what each mode deploys. The template is resolved with the local
emulator's resolver under given parameters, so the conditions are checked for what they decide, not for how
they are spelt.
"""

from __future__ import annotations

from typing import Any

import pytest
from cfnlint.decode.cfn_yaml import load

from fnserve.emulator.template import NO_VALUE, Resolver, Template
from tests.helpers import REPO

PATH = REPO / "infra" / "container" / "sagemaker.yaml"
SAGEMAKER: dict[str, Any] = load(str(PATH))
PARAMETERS: dict[str, Any] = SAGEMAKER["Parameters"]
RESOURCES: dict[str, Any] = SAGEMAKER["Resources"]

# SageMaker's ProductionVariantServerlessConfig: memory in 1 GB steps from 1 to 6 GB, 1 to 200 concurrent
# invocations, provisioned concurrency at most the maximum (and absent, not 0, when there is none).
MEMORY_SIZES_MB = [1024, 2048, 3072, 4096, 5120, 6144]
MAX_CONCURRENCY = 200
SERVERLESS = {"Mode": "serverless", "AsyncOutputBucket": ""}
# Bounds that would scale a real-time fleet: serverless must still register no target.
INSTANCES = {"MinInstances": "1", "MaxInstances": "4"}


def resolver(**parameters: str) -> Resolver:
    template = Template(PATH, PARAMETERS, SAGEMAKER["Conditions"], RESOURCES, SAGEMAKER)
    return Resolver(template, physical={}, attributes={}, overrides=parameters)


def variant(**parameters: str) -> dict[str, Any]:
    """The endpoint's one production variant as CloudFormation would create it under ``parameters``."""
    (resolved,) = resolver(**parameters).resolve(RESOURCES["EndpointConfig"]["Properties"]["ProductionVariants"])
    return resolved  # type: ignore[no-any-return]


def deployed(**parameters: str) -> set[str]:
    """The resources CloudFormation creates under ``parameters``: those with no condition or a true one."""
    r = resolver(**parameters)
    return {
        name
        for name, resource in RESOURCES.items()
        if "Condition" not in resource or r.condition(resource["Condition"])
    }


def test_serverless_is_a_mode() -> None:
    assert PARAMETERS["Mode"]["AllowedValues"] == ["realtime", "async", "serverless"]
    assert PARAMETERS["Mode"]["Default"] == "realtime"
    for mode in PARAMETERS["Mode"]["AllowedValues"]:
        assert resolver(Mode=mode).condition("IsServerless") is (mode == "serverless"), mode


def test_the_serverless_variant_has_a_memory_size_and_a_concurrency_instead_of_instances() -> None:
    resolved = variant(
        **SERVERLESS,
        ServerlessMemorySizeInMB="3072",
        ServerlessMaxConcurrency="50",
        ServerlessProvisionedConcurrency="5",
        InstanceType="ml.g5.xlarge",
    )
    assert resolved["ServerlessConfig"] == {
        "MemorySizeInMB": "3072",
        "MaxConcurrency": "50",
        "ProvisionedConcurrency": "5",
    }
    # No instances, and no instance-only setting: serverless has its own start budget.
    assert not {"InstanceType", "InitialInstanceCount", "ContainerStartupHealthCheckTimeoutInSeconds"} & set(resolved)
    assert (resolved["VariantName"], resolved["ModelName"]) == ("AllTraffic", "Model.ModelName")


def test_the_serverless_config_refers_to_its_parameters() -> None:
    (production,) = RESOURCES["EndpointConfig"]["Properties"]["ProductionVariants"]
    condition, config, otherwise = production["ServerlessConfig"]["Fn::If"]
    assert (condition, otherwise) == ("IsServerless", {"Ref": "AWS::NoValue"})
    assert config["MemorySizeInMB"] == {"Ref": "ServerlessMemorySizeInMB"}
    assert config["MaxConcurrency"] == {"Ref": "ServerlessMaxConcurrency"}
    assert config["ProvisionedConcurrency"] == {
        "Fn::If": ["HasProvisionedConcurrency", {"Ref": "ServerlessProvisionedConcurrency"}, {"Ref": "AWS::NoValue"}]
    }


def test_no_provisioned_concurrency_leaves_the_property_out() -> None:
    # SageMaker's minimum is 1: 0 must not reach it.
    assert PARAMETERS["ServerlessProvisionedConcurrency"]["Default"] == 0
    config = variant(**SERVERLESS)["ServerlessConfig"]
    assert "ProvisionedConcurrency" not in config
    defaults = (PARAMETERS["ServerlessMemorySizeInMB"]["Default"], PARAMETERS["ServerlessMaxConcurrency"]["Default"])
    assert (config["MemorySizeInMB"], config["MaxConcurrency"]) == defaults


def test_the_parameters_allow_what_sagemaker_allows() -> None:
    memory = PARAMETERS["ServerlessMemorySizeInMB"]
    assert memory["Type"] == "Number"
    assert memory["AllowedValues"] == MEMORY_SIZES_MB
    assert memory["Default"] in MEMORY_SIZES_MB
    concurrency = PARAMETERS["ServerlessMaxConcurrency"]
    assert (concurrency["Type"], concurrency["MinValue"], concurrency["MaxValue"]) == ("Number", 1, MAX_CONCURRENCY)
    assert 1 <= concurrency["Default"] <= MAX_CONCURRENCY
    provisioned = PARAMETERS["ServerlessProvisionedConcurrency"]
    assert (provisioned["Type"], provisioned["MinValue"], provisioned["MaxValue"]) == ("Number", 0, MAX_CONCURRENCY)


def test_serverless_says_it_needs_the_cpu_image() -> None:
    assert "no GPUs" in PARAMETERS["Mode"]["Description"]
    assert "CPU image" in PARAMETERS["Mode"]["Description"]


@pytest.mark.parametrize("mode", ["realtime", "async"])
def test_the_instance_modes_have_no_serverless_config(mode: str) -> None:
    resolved = variant(Mode=mode, AsyncOutputBucket="out", InstanceType="ml.g6.xlarge", **INSTANCES)
    assert "ServerlessConfig" not in resolved
    assert resolved["InstanceType"] == "ml.g6.xlarge"
    assert resolved["InitialInstanceCount"] == (1 if mode == "async" else "1")
    assert resolved["ContainerStartupHealthCheckTimeoutInSeconds"] == 600


def test_serverless_registers_no_autoscaling_and_no_async_resources() -> None:
    scaling = {
        name
        for name, resource in RESOURCES.items()
        if resource["Type"].startswith("AWS::ApplicationAutoScaling::") or resource["Type"] == "AWS::CloudWatch::Alarm"
    }
    assert scaling  # the instance modes have some: the check below is not empty
    assert scaling <= deployed(Mode="realtime", **INSTANCES) | deployed(Mode="async", AsyncOutputBucket="out")
    serverless = deployed(**SERVERLESS, **INSTANCES)
    assert serverless == {"ExecutionRole", "Model", "EndpointConfig", "Endpoint"}
    r = resolver(**SERVERLESS, **INSTANCES)
    assert r.resolve(RESOURCES["Endpoint"]["Properties"]["RetainAllVariantProperties"]) is NO_VALUE
    assert "AsyncInferenceConfig" not in r.resolve(RESOURCES["EndpointConfig"]["Properties"])


def test_the_serverless_role_writes_no_results() -> None:
    statements = resolver(**SERVERLESS, ModelBucket="models").resolve(
        RESOURCES["ExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    )
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert "s3:GetObject" in actions and "s3:PutObject" not in actions
