"""template.yaml's promises, checked on the template itself (cfn-lint and sam validate check the rest)."""

from __future__ import annotations

from typing import Any

import pytest
from cfnlint.decode.cfn_yaml import load

from fnserve.settings import Settings
from tests.helpers import REPO

TEMPLATE: dict[str, Any] = load(str(REPO / "template.yaml"))
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
FUNCTIONS = {name: r for name, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"}


def default(name: str) -> int:
    return int(PARAMETERS[name]["Default"])


def test_every_fnserve_variable_is_a_setting() -> None:
    variables = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    fields = {f"FNSERVE_{name.upper()}" for name in Settings.model_fields}
    assert {v for v in variables if v.startswith("FNSERVE_")} <= fields


def test_runtime_and_architecture() -> None:
    function = TEMPLATE["Globals"]["Function"]
    assert function["Runtime"] in ("python3.12", "python3.13")
    assert PARAMETERS["Architecture"]["AllowedValues"] == ["x86_64", "arm64"]
    assert RESOURCES["FnserveLayer"]["Metadata"]["BuildArchitecture"] == {"Ref": "Architecture"}


@pytest.mark.parametrize(
    ("queue", "window"),
    [("JobsQueue", "MaximumBatchingWindowInSeconds"), ("FollowupQueue", "FollowupBatchingWindowInSeconds")],
)
def test_visibility_timeouts_cover_six_function_timeouts_and_the_window(queue: str, window: str) -> None:
    properties = RESOURCES[queue]["Properties"]
    timeout = default(properties["VisibilityTimeout"]["Ref"])
    assert timeout >= 6 * default("JobsTimeout") + default(window)
    redrive = properties["RedrivePolicy"]
    assert redrive["maxReceiveCount"] >= 5
    variables = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    assert int(variables["FNSERVE_MAX_RECEIVE_COUNT"]) == redrive["maxReceiveCount"]


def _statements(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if "Effect" in node and "Action" in node:
            found.append(node)
        for value in node.values():
            found += _statements(value)
    elif isinstance(node, list):
        for value in node:
            found += _statements(value)
    return found


def test_no_policy_allows_anything_on_every_resource() -> None:
    statements = _statements(RESOURCES)
    assert statements
    for statement in statements:
        if statement["Effect"] != "Allow":
            continue
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        assert "*" not in resources, statement
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert not any(a == "*" or a.endswith(":*") for a in actions), statement


def test_sqs_functions_report_partial_batch_failures() -> None:
    for name in ("BatchFunction", "FollowupFunction"):
        (event,) = FUNCTIONS[name]["Properties"]["Events"].values()
        assert event["Type"] == "SQS"
        assert event["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_the_table_and_bucket_are_protected() -> None:
    table = RESOURCES["ResultsTable"]["Properties"]
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["SSESpecification"]["SSEEnabled"] is True
    block = RESOURCES["PayloadBucket"]["Properties"]["PublicAccessBlockConfiguration"]
    assert all(block.values())


def test_the_api_requires_iam_by_default() -> None:
    assert PARAMETERS["ApiAuth"]["Default"] == "IAM"
    for route in ("HttpApiRoute", "HttpApiRootRoute"):
        assert RESOURCES[route]["Properties"]["AuthorizationType"] == {
            "Fn::If": ["IsIam", "AWS_IAM", {"Fn::If": ["IsJwt", "JWT", "NONE"]}]
        }


def test_every_function_has_sample_events() -> None:
    events = {p.name for p in (REPO / "events").glob("*.json")}
    assert {"api-http-infer.json", "api-http-infer-binary.json", "api-http-metadata.json"} <= events  # ApiFunction
    assert "batch-jobs.json" in events  # BatchFunction
    assert "followup-jobs.json" in events  # FollowupFunction
    for name, function in FUNCTIONS.items():
        assert (REPO / function["Properties"]["CodeUri"] / "app.py").exists(), name


def test_the_sample_events_are_what_the_template_deploys_would_send() -> None:
    """events/ describes the deployed API and queues; other integrations' events live in tests/events/."""
    import json

    routes = {
        r["Properties"]["RouteKey"]: r["Properties"]["ApiId"]
        for r in RESOURCES.values()
        if r["Type"] == "AWS::ApiGatewayV2::Route"
    }
    sqs_functions = {
        name
        for name, f in FUNCTIONS.items()
        if any(e["Type"] == "SQS" for e in f["Properties"].get("Events", {}).values())
    }
    for path in sorted((REPO / "events").glob("*.json")):
        event = json.loads(path.read_text())
        if "Records" in event:
            assert all(r["eventSource"] == "aws:sqs" for r in event["Records"]), path.name
            assert {"BatchFunction", "FollowupFunction"} <= sqs_functions
            continue
        assert event.get("version") == "2.0", f"{path.name}: the template deploys an HTTP API (payload 2.0) only"
        assert event["routeKey"] in routes, f"{path.name}: route {event['routeKey']!r} is not in template.yaml"
        proxy = event["rawPath"].removeprefix("/v2/")
        assert event["pathParameters"] == {"proxy": proxy}, path.name


def test_functions_that_read_payloads_may_list_their_bucket() -> None:
    """Without s3:ListBucket, S3 answers a missing payload with AccessDenied: a reason no user can act on."""
    for name, function in FUNCTIONS.items():
        statements = {
            s["Sid"]: s for p in function["Properties"]["Policies"] if "Statement" in p for s in p["Statement"]
        }
        if "Payloads" in statements:
            listing = statements["MissingPayloadsReadAsMissing"]
            assert listing["Action"] == "s3:ListBucket", name
            assert listing["Resource"] == {"Fn::GetAtt": ["PayloadBucket", "Arn"]}, name
