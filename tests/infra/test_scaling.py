"""Scaling in the CloudFormation templates: SageMaker endpoint variants and the HTTP function's provisioned
concurrency, each under Application Auto Scaling, checked on the templates (cfn-lint checks the schemas).

Conditions are evaluated with the local emulator's resolver, so each is checked for what it decides under
given parameters, not for how it is spelt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode.cfn_yaml import load

from fnserve.emulator.template import NO_VALUE, Resolver, Template
from tests.helpers import REPO
from tests.helpers.sam import translated

SAGEMAKER_PATH = REPO / "infra" / "container" / "sagemaker.yaml"
SAM_PATH = REPO / "template.yaml"
SAGEMAKER: dict[str, Any] = load(str(SAGEMAKER_PATH))
SAM: dict[str, Any] = load(str(SAM_PATH))


def resolver(path: Path, document: dict[str, Any], **parameters: str) -> Resolver:
    template = Template(path, document["Parameters"], document["Conditions"], document["Resources"], document)
    return Resolver(template, physical={}, attributes={}, overrides=parameters)


def conditions(path: Path, document: dict[str, Any], names: list[str], **parameters: str) -> dict[str, bool]:
    r = resolver(path, document, **parameters)
    return {name: r.condition(name) for name in names}


def targets(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        n: r for n, r in document["Resources"].items() if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
    }


# -- SageMaker ------------------------------------------------------------------------------------------


def test_the_scalable_target_is_the_endpoints_variant_between_the_instance_parameters() -> None:
    resources = SAGEMAKER["Resources"]
    (variant,) = resources["EndpointConfig"]["Properties"]["ProductionVariants"]
    target = resources["ScalableTarget"]
    props = target["Properties"]
    assert target["Condition"] == "Scales"
    assert (props["ServiceNamespace"], props["ScalableDimension"]) == (
        "sagemaker",
        "sagemaker:variant:DesiredInstanceCount",
    )
    assert props["ResourceId"] == {"Fn::Sub": f"endpoint/${{Endpoint.EndpointName}}/variant/{variant['VariantName']}"}
    assert props["MaxCapacity"] == {"Ref": "MaxInstances"}
    assert "RoleARN" not in props  # Application Auto Scaling's service-linked role
    assert set(targets(SAGEMAKER)) == {"ScalableTarget"}

    realtime = resolver(SAGEMAKER_PATH, SAGEMAKER, Mode="realtime", MinInstances="3", MaxInstances="5")
    assert realtime.resolve(props["MinCapacity"]) == "3"
    async_ = resolver(SAGEMAKER_PATH, SAGEMAKER, Mode="async", AsyncOutputBucket="out", MinInstances="3")
    assert async_.resolve(props["MinCapacity"]) == 0


def test_the_endpoint_starts_with_min_instances_in_real_time_and_one_instance_async() -> None:
    (variant,) = SAGEMAKER["Resources"]["EndpointConfig"]["Properties"]["ProductionVariants"]
    count = variant["InitialInstanceCount"]
    assert resolver(SAGEMAKER_PATH, SAGEMAKER, Mode="realtime", MinInstances="3").resolve(count) == "3"
    assert resolver(SAGEMAKER_PATH, SAGEMAKER, Mode="async", AsyncOutputBucket="out").resolve(count) == 1
    parameter = SAGEMAKER["Parameters"]["MinInstances"]
    assert parameter["MinValue"] == 1 and parameter["Default"] == 1


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({"Mode": "realtime", "MinInstances": "1", "MaxInstances": "4"}, {"ScalesRealtime": True, "Scales": True}),
        ({"Mode": "realtime", "MinInstances": "2", "MaxInstances": "2"}, {"ScalesRealtime": False, "Scales": False}),
        ({"Mode": "async", "MinInstances": "1", "MaxInstances": "1"}, {"ScalesRealtime": False, "Scales": True}),
        ({"Mode": "async", "MinInstances": "1", "MaxInstances": "4"}, {"ScalesRealtime": False, "Scales": True}),
    ],
)
def test_what_scales_under_which_parameters(parameters: dict[str, str], expected: dict[str, bool]) -> None:
    assert conditions(SAGEMAKER_PATH, SAGEMAKER, list(expected), **parameters) == expected


def test_the_defaults_scale_a_real_time_endpoint() -> None:
    # MaxInstances used to be documented as bounding autoscaling while real-time mode had none.
    assert conditions(SAGEMAKER_PATH, SAGEMAKER, ["ScalesRealtime"]) == {"ScalesRealtime": True}


def target_tracking(policy: dict[str, Any], condition: str, target: str, metric: str) -> dict[str, Any]:
    """A target-tracking policy's configuration, once its condition, target and predefined metric are checked."""
    assert policy["Condition"] == condition
    props = policy["Properties"]
    assert props["PolicyType"] == "TargetTrackingScaling"
    assert props["ScalingTargetId"] == {"Ref": target}
    config: dict[str, Any] = props["TargetTrackingScalingPolicyConfiguration"]
    assert config["PredefinedMetricSpecification"] == {"PredefinedMetricType": metric}
    return config


def test_real_time_tracks_invocations_per_instance() -> None:
    policy = SAGEMAKER["Resources"]["InvocationsPolicy"]
    config = target_tracking(policy, "ScalesRealtime", "ScalableTarget", "SageMakerVariantInvocationsPerInstance")
    assert config["TargetValue"] == {"Ref": "InvocationsPerInstanceTarget"}
    assert config["ScaleInCooldown"] == {"Ref": "ScaleInCooldown"}
    assert config["ScaleOutCooldown"] == {"Ref": "ScaleOutCooldown"}


def test_a_scaled_real_time_fleet_keeps_its_size_through_an_update() -> None:
    retain = SAGEMAKER["Resources"]["Endpoint"]["Properties"]["RetainAllVariantProperties"]
    scaled = resolver(SAGEMAKER_PATH, SAGEMAKER, Mode="realtime", MinInstances="1", MaxInstances="3")
    fixed = resolver(SAGEMAKER_PATH, SAGEMAKER, Mode="realtime", MinInstances="3", MaxInstances="3")
    assert scaled.resolve(retain) is True
    assert fixed.resolve(retain) is NO_VALUE  # a fixed fleet's count is the template's: a new one must apply


def test_async_still_scales_on_its_backlog_down_to_zero_and_starts_from_zero_on_an_alarm() -> None:
    resources = SAGEMAKER["Resources"]
    for name in ("BacklogPolicy", "ScaleFromZeroPolicy", "HasBacklogWithoutCapacity"):
        assert resources[name]["Condition"] == "IsAsync", name
    backlog = resources["BacklogPolicy"]["Properties"]
    assert backlog["ScalingTargetId"] == {"Ref": "ScalableTarget"}
    config = backlog["TargetTrackingScalingPolicyConfiguration"]
    assert config["CustomizedMetricSpecification"]["MetricName"] == "ApproximateBacklogSizePerInstance"
    # The cooldowns are shared, with the values async had before they became parameters.
    assert config["ScaleInCooldown"] == {"Ref": "ScaleInCooldown"}
    assert config["ScaleOutCooldown"] == {"Ref": "ScaleOutCooldown"}
    assert (
        SAGEMAKER["Parameters"]["ScaleInCooldown"]["Default"],
        SAGEMAKER["Parameters"]["ScaleOutCooldown"]["Default"],
    ) == (300, 60)
    assert resources["ScaleFromZeroPolicy"]["Properties"]["ScalingTargetId"] == {"Ref": "ScalableTarget"}
    alarm = resources["HasBacklogWithoutCapacity"]["Properties"]
    assert alarm["MetricName"] == "HasBacklogWithoutCapacity"
    assert alarm["AlarmActions"] == [{"Ref": "ScaleFromZeroPolicy"}]


# -- the SAM application's provisioned concurrency --------------------------------------------------------


def _resource_id(target: dict[str, Any], twin: str, function: str, alias_arn: str) -> str:
    """The target's ResourceId as CloudFormation evaluates it for ``twin`` (the zip or the image function), given
    the function's name and alias's ARN."""
    condition, image, zipped = target["Properties"]["ResourceId"]["Fn::If"]
    assert condition == "UseImage"
    text, variables = (image if twin == "ApiImageFunction" else zipped)["Fn::Sub"]
    ((variable, select),) = variables.items()
    index, split = select["Fn::Select"]
    delimiter, reference = split["Fn::Split"]
    assert reference == {"Ref": f"{twin}.Alias"}
    value = alias_arn.split(delimiter)[index]
    return str(text.replace(f"${{{twin}}}", function).replace(f"${{{variable}}}", value))


def test_provisioned_concurrency_scales_on_the_http_functions_alias() -> None:
    resources = SAM["Resources"]
    target = resources["ApiProvisionedConcurrencyTarget"]
    props = target["Properties"]
    assert target["Condition"] == "ScalesProvisionedConcurrency"
    assert (props["ServiceNamespace"], props["ScalableDimension"]) == (
        "lambda",
        "lambda:function:ProvisionedConcurrency",
    )
    assert props["MinCapacity"] == {"Ref": "ProvisionedConcurrency"}
    assert props["MaxCapacity"] == {"Ref": "ProvisionedConcurrencyMax"}
    assert "RoleARN" not in props
    alias = SAM["Globals"]["Function"]["AutoPublishAlias"]
    function = "fnserve-ApiFunction-AbC123"
    arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function}:{alias}"
    for twin in ("ApiFunction", "ApiImageFunction"):  # whichever packaging the stack runs
        assert _resource_id(target, twin, function, arn) == f"function:{function}:{alias}"
    assert set(targets(SAM)) == {"ApiProvisionedConcurrencyTarget"}


@pytest.mark.parametrize(("branch", "twin", "image_uri"), [(2, "ApiFunction", ""), (1, "ApiImageFunction", "r/i:1")])
def test_the_target_refers_to_the_alias_sam_publishes_so_it_waits_for_it(
    monkeypatch: pytest.MonkeyPatch, branch: int, twin: str, image_uri: str
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # SAM's translator fills in AWS::Region
    resources = translated(ProvisionedConcurrency="5", ImageUri=image_uri)["Resources"]
    target = resources["ApiProvisionedConcurrencyTarget"]["Properties"]
    sub = target["ResourceId"]["Fn::If"][branch]["Fn::Sub"]
    split = sub[1]["AliasName"]["Fn::Select"][1]["Fn::Split"]
    alias = split[1]["Ref"]
    alias_name = SAM["Globals"]["Function"]["AutoPublishAlias"]
    assert alias == f"{twin}Alias{alias_name}"
    assert resources[alias]["Type"] == "AWS::Lambda::Alias"
    assert resources[alias]["Properties"]["Name"] == alias_name
    # The floor is also the alias's own provisioned concurrency: warm from the first deploy.
    config = resources[alias]["Properties"]["ProvisionedConcurrencyConfig"]["Fn::If"]
    assert config[:2] == [
        "HasProvisionedConcurrency",
        {"ProvisionedConcurrentExecutions": {"Ref": "ProvisionedConcurrency"}},
    ]


def test_provisioned_concurrency_tracks_its_utilisation() -> None:
    policy = SAM["Resources"]["ApiProvisionedConcurrencyPolicy"]
    config = target_tracking(
        policy,
        "ScalesProvisionedConcurrency",
        "ApiProvisionedConcurrencyTarget",
        "LambdaProvisionedConcurrencyUtilization",
    )
    assert config["TargetValue"] == {"Ref": "ProvisionedConcurrencyUtilization"}
    utilisation = SAM["Parameters"]["ProvisionedConcurrencyUtilization"]
    assert 0 < utilisation["MinValue"] <= utilisation["Default"] <= utilisation["MaxValue"] < 1


@pytest.mark.parametrize(
    ("parameters", "scales"),
    [
        ({}, False),  # the default: no provisioned concurrency, nothing to scale
        ({"ProvisionedConcurrency": "0", "ProvisionedConcurrencyMax": "20"}, False),
        ({"ProvisionedConcurrency": "5"}, True),
        ({"ProvisionedConcurrency": "5", "ProvisionedConcurrencyMax": "20"}, True),
        ({"ProvisionedConcurrency": "5", "ProvisionedConcurrencyMax": "5"}, False),  # fixed
    ],
)
def test_provisioned_concurrency_scales_only_when_it_is_set_and_its_bounds_differ(
    parameters: dict[str, str], scales: bool
) -> None:
    assert conditions(SAM_PATH, SAM, ["ScalesProvisionedConcurrency"], **parameters) == {
        "ScalesProvisionedConcurrency": scales
    }


def test_snapstart_still_excludes_provisioned_concurrency_and_so_its_scaling() -> None:
    rule = SAM["Rules"]["SnapStartWithoutProvisionedConcurrency"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "SnapStart"}, "true"]}
    assert rule["Assertions"][0]["Assert"] == {"Fn::Equals": [{"Ref": "ProvisionedConcurrency"}, 0]}
    # What the rule lets through with SnapStart (no provisioned concurrency) scales nothing.
    assert conditions(
        SAM_PATH, SAM, ["ScalesProvisionedConcurrency"], SnapStart="true", ProvisionedConcurrency="0"
    ) == {"ScalesProvisionedConcurrency": False}


def test_every_function_gets_the_ephemeral_storage_parameter() -> None:
    assert SAM["Globals"]["Function"]["EphemeralStorage"] == {"Size": {"Ref": "EphemeralStorage"}}
    functions = [r for r in SAM["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    assert len(functions) == 7  # three functions, each a zip and an image twin, and the API-key authorizer
    assert not any("EphemeralStorage" in f["Properties"] for f in functions)  # none overrides the Globals
    parameter = SAM["Parameters"]["EphemeralStorage"]
    assert (parameter["MinValue"], parameter["MaxValue"], parameter["Default"]) == (512, 10240, 512)
