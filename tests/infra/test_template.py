"""template.yaml's promises, checked on the template itself (cfn-lint and sam validate check the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode.cfn_yaml import load

from fnserve.settings import Settings
from tests.helpers import REPO, requirements

TEMPLATE: dict[str, Any] = load(str(REPO / "template.yaml"))
RESOURCES: dict[str, Any] = TEMPLATE["Resources"]
PARAMETERS: dict[str, Any] = TEMPLATE["Parameters"]
FUNCTIONS = {name: r for name, r in RESOURCES.items() if r["Type"] == "AWS::Serverless::Function"}


def default(name: str) -> int:
    return int(PARAMETERS[name]["Default"])


def policy_statements(function: dict[str, Any]) -> list[dict[str, Any]]:
    """What a function's policies grant: inline statements, and those of the template's managed policies it names."""
    found: list[dict[str, Any]] = []
    for policy in function["Properties"].get("Policies", []):
        if isinstance(policy, dict) and policy.get("Ref") in RESOURCES:
            policy = RESOURCES[policy["Ref"]]["Properties"]["PolicyDocument"]
        found += policy.get("Statement", []) if isinstance(policy, dict) else []
    return found


def test_every_fnserve_variable_is_a_setting() -> None:
    variables = TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]
    fields = {f"FNSERVE_{name.upper()}" for name in Settings.field_names()}
    assert {v for v in variables if v.startswith("FNSERVE_")} <= fields


def test_logs_are_json_at_a_level_lambda_sets() -> None:
    """Lambda's advanced logging controls: the level reaches fnserve as AWS_LAMBDA_LOG_LEVEL (see adapters.logs)."""
    logging_config = TEMPLATE["Globals"]["Function"]["LoggingConfig"]
    assert logging_config["LogFormat"] == "JSON" and logging_config["ApplicationLogLevel"] == "INFO"
    assert "FNSERVE_LOG_LEVEL" not in TEMPLATE["Globals"]["Function"]["Environment"]["Variables"]


def test_runtime_and_architecture() -> None:
    zipped = [f["Properties"] for f in FUNCTIONS.values() if f["Properties"].get("PackageType") != "Image"]
    assert len(zipped) == 4 and all(f["Runtime"] in ("python3.12", "python3.13") for f in zipped)
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


def test_the_api_requires_iam_by_default_and_every_route_the_chosen_mode() -> None:
    assert PARAMETERS["ApiAuth"]["Default"] == "IAM"
    routes = [r["Properties"] for r in RESOURCES.values() if r["Type"] == "AWS::ApiGatewayV2::Route"]
    assert len(routes) > 3
    for route in routes:
        assert route["AuthorizationType"] == {
            "Fn::If": ["IsIam", "AWS_IAM", {"Fn::If": ["IsJwt", "JWT", {"Fn::If": ["IsApiKey", "CUSTOM", "NONE"]}]}]
        }
        assert route["AuthorizerId"] == {
            "Fn::If": [
                "IsJwt",
                {"Ref": "JwtAuthorizer"},
                {"Fn::If": ["IsApiKey", {"Ref": "ApiKeyAuthorizer"}, {"Ref": "AWS::NoValue"}]},
            ]
        }


def test_the_api_key_mode_checks_a_bearer_key_against_its_secret_with_least_privilege() -> None:
    authorizer = RESOURCES["ApiKeyAuthorizer"]["Properties"]
    assert (authorizer["AuthorizerType"], authorizer["AuthorizerPayloadFormatVersion"]) == ("REQUEST", "2.0")
    assert authorizer["EnableSimpleResponses"] is True
    # The header as identity source: API Gateway refuses a request without it (401) and caches by its value.
    assert authorizer["IdentitySource"] == ["$request.header.Authorization"]
    assert authorizer["AuthorizerResultTtlInSeconds"] == {"Ref": "ApiKeyCacheSeconds"}
    assert PARAMETERS["ApiKeyCacheSeconds"]["MaxValue"] == 3600  # API Gateway's most
    function = FUNCTIONS["ApiKeyAuthorizerFunction"]
    assert function["Condition"] == "IsApiKey" and function["Properties"]["Layers"] == [{"Ref": "FnserveLayer"}]
    assert function["Properties"]["Environment"]["Variables"] == {"FNSERVE_API_KEYS_SECRET": {"Ref": "ApiKeys"}}
    [statement] = policy_statements(function)
    assert (statement["Action"], statement["Resource"]) == ("secretsmanager:GetSecretValue", {"Ref": "ApiKeys"})
    permission = RESOURCES["ApiKeyAuthorizerPermission"]["Properties"]
    assert permission["Principal"] == "apigateway.amazonaws.com"
    assert permission["SourceArn"]["Fn::Sub"].endswith("/authorizers/${ApiKeyAuthorizer}")  # this authorizer alone
    for name in ("ApiKeys", "ApiKeyAuthorizer", "ApiKeyAuthorizerPermission", "ApiKeyAuthorizerLogs"):
        assert RESOURCES[name]["Condition"] == "IsApiKey", name


def test_every_function_has_sample_events() -> None:
    events = {p.name for p in (REPO / "events").glob("*.json")}
    assert {"api-http-infer.json", "api-http-infer-binary.json", "api-http-metadata.json"} <= events  # ApiFunction
    assert "batch-jobs.json" in events  # BatchFunction
    assert "followup-jobs.json" in events  # FollowupFunction
    for name, function in FUNCTIONS.items():
        props = function["Properties"]
        if props.get("PackageType") == "Image":  # the image's WORKDIR holds functions/ as the repository does
            module, _ = props["ImageConfig"]["Command"][0].rsplit(".", 1)
            assert (REPO / f"{module}.py").exists(), name
        else:
            assert (REPO / props["CodeUri"] / "app.py").exists(), name


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
        if name == "ApiKeyAuthorizerFunction":  # reads its secret, nothing else
            continue
        statements = {s["Sid"]: s for s in policy_statements(function)}
        assert "Payloads" in statements, name
        if "Payloads" in statements:
            listing = statements["MissingPayloadsReadAsMissing"]
            assert listing["Action"] == "s3:ListBucket", name
            assert listing["Resource"] == {"Fn::GetAtt": ["PayloadBucket", "Arn"]}, name


def test_every_function_keeps_its_logs_for_a_set_time() -> None:
    groups = {}
    for r in RESOURCES.values():
        if r["Type"] == "AWS::Logs::LogGroup" and "LogGroupName" in r["Properties"]:
            name = r["Properties"]["LogGroupName"]
            if "Fn::Sub" in name:  # a function without an image twin
                groups[name["Fn::Sub"]] = r["Properties"]["RetentionInDays"]
                continue
            condition, image, zipped = name["Fn::If"]  # whichever twin runs
            assert condition == "UseImage"
            for name in (image["Fn::Sub"], zipped["Fn::Sub"]):
                groups[name] = r["Properties"]["RetentionInDays"]
    assert groups == {f"/aws/lambda/${{{name}}}": {"Ref": "LogRetentionInDays"} for name in FUNCTIONS}
    assert RESOURCES["HttpApiAccessLogs"]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionInDays"}


def test_alarms_watch_the_dead_letter_queues_errors_throttles_and_5xx_and_notify_the_optional_topic() -> None:
    alarms = {name: r["Properties"] for name, r in RESOURCES.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    watched = {a.get("MetricName") or a["Metrics"][0]["MetricStat"]["Metric"]["MetricName"] for a in alarms.values()}
    assert watched == {"ApproximateNumberOfMessagesVisible", "Errors", "Throttles", "5xx"}
    dlqs = {a["Dimensions"][0]["Value"]["Fn::GetAtt"][0] for a in alarms.values() if a.get("Namespace") == "AWS/SQS"}
    assert dlqs == {"JobsDeadLetterQueue", "FollowupDeadLetterQueue"}
    notify = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == notify
        assert alarm["TreatMissingData"] == "notBreaching"


def test_queues_cannot_take_every_concurrent_execution() -> None:
    for name in ("BatchFunction", "FollowupFunction"):
        (event,) = FUNCTIONS[name]["Properties"]["Events"].values()
        assert event["Properties"]["ScalingConfig"] == {"MaximumConcurrency": {"Ref": "JobsMaximumConcurrency"}}
    assert PARAMETERS["JobsMaximumConcurrency"]["MinValue"] == 2  # SQS's own floor


def test_a_new_http_function_version_rolls_out_as_chosen_and_back_on_its_alarms() -> None:
    preference = FUNCTIONS["ApiFunction"]["Properties"]["DeploymentPreference"]
    assert preference["Type"] == {"Ref": "DeploymentType"}
    assert preference["Alarms"] == [{"Ref": "ApiErrorsAlarm"}, {"Ref": "Api5xxAlarm"}]
    assert PARAMETERS["DeploymentType"]["Default"] == "AllAtOnce"
    assert "Canary10Percent5Minutes" in PARAMETERS["DeploymentType"]["AllowedValues"]


def test_cors_is_a_parameter_off_by_default() -> None:
    assert PARAMETERS["CorsAllowOrigins"]["Default"] == ""
    cors = RESOURCES["HttpApi"]["Properties"]["CorsConfiguration"]["Fn::If"]
    assert cors[0] == "HasCors" and cors[2] == {"Ref": "AWS::NoValue"}
    assert "inference-header-content-length" in cors[1]["AllowHeaders"]
    assert {"x-request-id", "server-timing"} <= set(cors[1]["ExposeHeaders"])


def test_samconfig_deploys_without_questions() -> None:
    import tomllib

    config = tomllib.loads((REPO / "samconfig.toml").read_text())
    assert config["default"]["global"]["parameters"]["stack_name"] == "fnserve"
    deploy = config["default"]["deploy"]["parameters"]
    # A managed artifact bucket, the IAM roles the stack makes, and a change set to confirm.
    assert deploy["resolve_s3"] is True and "CAPABILITY_IAM" in deploy["capabilities"].split()
    assert deploy["confirm_changeset"] is True
    assert "deploy: sam-build" in (REPO / "Makefile").read_text()


def test_make_delete_runs_the_sam_cli_make_installed_on_samconfigs_stack() -> None:
    """The SAM CLI lives in .venv-sam, not on a reader's PATH: the pages' teardown is `make delete`."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "delete"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert ".venv-sam/bin/sam delete" in planned.splitlines()[-1]  # samconfig.toml's global stack_name, asked first
    for page in ("aws.md", "lambda.md"):
        assert "`make delete`" in (REPO / "docs" / page).read_text(), page


def test_make_run_installs_the_emulators_extra_and_passes_a_manifest_only_when_given(tmp_path: Path) -> None:
    """A fresh checkout's make run installs .[local], not the development set; MANIFEST=... reaches every function,
    and without it the template's own manifest (the layer's, or ModelBucket's) stays."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make test

    def planned(*args: str) -> list[str]:
        command = ["make", "--no-print-directory", "-n", "run", f"VENV={tmp_path / 'venv'}", *args]
        return subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, check=True
        ).stdout.splitlines()

    fresh = planned()
    assert any(line.endswith("pip install -q -e '.[local]'") for line in fresh), fresh
    assert "fnserve local --template template.yaml" in fresh[-1] and "--manifest" not in fresh[-1], fresh[-1]
    assert planned("MANIFEST=my-models/manifest.toml")[-1].endswith("--manifest my-models/manifest.toml")


def test_the_follow_up_id_key_is_read_at_run_time_not_put_in_the_environment() -> None:
    import json

    text = json.dumps(TEMPLATE)
    assert "resolve:secretsmanager" not in text and '"FNSERVE_RESULT_ID_KEY"' not in text
    for name in ("ApiFunction", "ApiImageFunction"):
        api = FUNCTIONS[name]
        assert api["Properties"]["Environment"]["Variables"]["FNSERVE_RESULT_ID_KEY_SECRET"] == {"Ref": "ResultIdKey"}
        statement = next(s for s in policy_statements(api) if s["Sid"] == "FollowupIdKey")
        assert statement["Action"] == "secretsmanager:GetSecretValue"
        assert statement["Resource"] == {"Ref": "ResultIdKey"}


TWINS = {"ApiFunction": "api", "BatchFunction": "batch", "FollowupFunction": "followup"}


@pytest.mark.parametrize("name", TWINS)
def test_each_function_runs_as_zip_or_as_the_image_one_at_a_time_with_the_same_settings(name: str) -> None:
    zipped, image = FUNCTIONS[name], FUNCTIONS[name.replace("Function", "ImageFunction")]
    assert (zipped["Condition"], image["Condition"]) == ("UseZip", "UseImage")
    assert TEMPLATE["Conditions"]["UseImage"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "ImageUri"}, ""]}]}
    assert PARAMETERS["ImageUri"]["Default"] == ""  # zip + layers stays the default
    props = image["Properties"]
    assert (props["PackageType"], props["ImageUri"]) == ("Image", {"Ref": "ImageUri"})
    assert props["ImageConfig"]["Command"] == [f"functions/{TWINS[name]}/app.handler"]
    assert not {"CodeUri", "Runtime", "Handler", "Layers", "SnapStart"} & set(props)  # an image carries them
    for key in ("MemorySize", "Timeout", "ReservedConcurrentExecutions", "Events", "Policies", "Environment"):
        assert props.get(key) == zipped["Properties"].get(key), key
    lambda_image = (REPO / "infra" / "container" / "lambda.Dockerfile").read_text()
    assert f"COPY functions/{TWINS[name]}/app.py functions/{TWINS[name]}/app.py" in lambda_image


@pytest.mark.parametrize("name", TWINS)
def test_whatever_refers_to_a_function_follows_the_packaging(name: str) -> None:
    import json

    image = name.replace("Function", "ImageFunction")
    for other, resource in RESOURCES.items():
        if other in (name, image):
            continue
        text = json.dumps(resource)
        mentions = text.count(f'"{name}') + text.count(f"${{{name}}}")
        assert mentions == text.count(f'"{image}') + text.count(f"${{{image}}}"), other
        if mentions:
            assert '"UseImage"' in text, other


def test_snapstart_is_refused_with_an_image() -> None:
    rule = TEMPLATE["Rules"]["SnapStartWithoutProvisionedConcurrency"]
    assert {"Assert": {"Fn::Equals": [{"Ref": "ImageUri"}, ""]}} == {"Assert": rule["Assertions"][1]["Assert"]}


def test_snapstart_is_refused_with_more_than_512_mb_of_tmp() -> None:
    """Lambda refuses SnapStart with ephemeral storage over 512 MB, its least: the rule says so before a deploy."""
    rule = TEMPLATE["Rules"]["SnapStartWithoutProvisionedConcurrency"]
    assert rule["Assertions"][2]["Assert"] == {"Fn::Equals": [{"Ref": "EphemeralStorage"}, "512"]}
    assert TEMPLATE["Parameters"]["EphemeralStorage"]["MinValue"] == 512  # so "not over 512" is "512"


@pytest.mark.parametrize("image_uri", ["", "123456789012.dkr.ecr.us-east-1.amazonaws.com/fnserve:lambda"])
def test_sam_translates_the_chosen_packaging(image_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.sam import translated

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    resources = translated(ImageUri=image_uri)["Resources"]
    functions = {name: r for name, r in resources.items() if r["Type"] == "AWS::Lambda::Function"}
    assert len(functions) == 7  # CloudFormation drops the three whose condition is false, and the authorizer
    for name, function in functions.items():
        props = function["Properties"]
        if name == "ApiKeyAuthorizerFunction":  # zip whatever the packaging: fnserve's layer, no models
            assert function["Condition"] == "IsApiKey" and len(props["Layers"]) == 1
        elif "Image" in name:
            assert function["Condition"] == "UseImage" and props["PackageType"] == "Image", name
            assert props["Code"] == {"ImageUri": image_uri} and "Layers" not in props, name
        else:
            assert function["Condition"] == "UseZip" and props["Runtime"].startswith("python3"), name
            assert len(props["Layers"]) == 2, name


@pytest.mark.parametrize("image_uri", ["", "123456789012.dkr.ecr.us-east-1.amazonaws.com/fnserve:lambda"])
def test_fnserve_local_runs_the_twins_the_parameters_choose(image_uri: str) -> None:
    from fnserve.emulator.functions import collect
    from fnserve.emulator.template import Resolver, load_template

    template = load_template(REPO / "template.yaml")
    queues = [name for name, r in RESOURCES.items() if r["Type"] == "AWS::SQS::Queue"]
    physical = {name: f"http://sqs.local/{name}" for name in queues}
    attributes = {(name, "Arn"): f"arn:aws:sqs:us-east-1:123456789012:{name}" for name in queues}
    app = collect(template, Resolver(template, physical, attributes, {"ImageUri": image_uri}), REPO, workers=1)
    twin = "ImageFunction" if image_uri else "Function"
    names = {name.replace("Function", twin) for name in TWINS}
    assert set(app.functions) == names
    assert {route.function for route in app.routes} == {f"Api{twin}"}
    assert {source.function for source in app.sources} == {f"Batch{twin}", f"Followup{twin}"}
    for name, spec in app.functions.items():
        if image_uri:  # started from the image (local.images), its command and the image's own paths
            assert spec.image == image_uri and spec.command[0].startswith("functions/"), name
            assert spec.env["FNSERVE_MANIFEST"] == "/opt/models/manifest.toml" and spec.code_dir == "", name
        else:
            assert not spec.image and (Path(spec.code_dir) / "app.py").exists(), name
            assert Path(spec.env["FNSERVE_MANIFEST"]).is_file(), name  # /opt/models mapped to the models layer


def test_the_runtime_layer_installs_what_the_lambda_extra_names() -> None:
    """sam build reads layers/fnserve/requirements.txt, the lambda extra's lock (make locks): it pins each of the
    extra's requirements, and not boto3, which the Lambda runtime brings to zip functions."""
    from packaging.requirements import Requirement

    layer = (REPO / "layers" / "fnserve" / "requirements.txt").read_text().splitlines()
    pinned = {Requirement(line).name.lower() for line in layer if line.strip() and line[0] not in "# "}
    assert {Requirement(line).name.lower() for line in requirements(["lambda"])} <= pinned
    assert "boto3" not in pinned and "botocore" not in pinned
