"""infra/aws/deployer/*.json grant, together, what ``sam deploy`` and ``sam delete`` of template.yaml need, and no more.

What is needed comes from the template: SAM's translator turns it into the CloudFormation resources it creates (a
function into its role, versions, alias, queue trigger and CodeDeploy group), and CloudFormation's own resource
schemas (cfn-lint ships them) list the permissions each resource type's create, read, update and delete handlers
call. Each must be granted on the ARN CloudFormation gives that resource in the stack samconfig.toml names, and not
on another stack's, unless NOT_USED says why this template never makes the handler call it; SAM CLI's own calls
(change sets, its artifact bucket) are in ``sam_cli_needs``. Every action the policies grant must be one of them.
They are several managed policies because IAM refuses one over 6,144 characters; each must stay under it.

Conditions are checked on their own (``test_the_conditions_...``); matching ignores them. Nothing here calls AWS:
what AWS itself would refuse is only known by deploying (docs/aws.md says so).
"""

from __future__ import annotations

import functools
import json
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

import pytest

from tests.helpers import REPO
from tests.helpers.sam import translated

DEPLOYER = REPO / "infra" / "aws" / "deployer"
POLICIES: dict[str, dict[str, Any]] = {p.name: json.loads(p.read_text()) for p in sorted(DEPLOYER.glob("*.json"))}
STATEMENTS: list[dict[str, Any]] = [s for policy in POLICIES.values() for s in policy["Statement"]]
SAMCONFIG = tomllib.loads((REPO / "samconfig.toml").read_text())
STACK: str = SAMCONFIG["default"]["global"]["parameters"]["stack_name"]
ARTIFACTS_PREFIX: str = SAMCONFIG["default"]["deploy"]["parameters"]["s3_prefix"]
REGION, ACCOUNT = "us-east-1", "123456789012"
SAM_STACK = "aws-sam-cli-managed-default"  # what `sam deploy --resolve-s3` creates once per account and region
SAM_BUCKET = f"{SAM_STACK}-samclisourcebucket-q1w2e3r4t5y6"
SUFFIX = "Q1W2E3R4T5Y6"  # CloudFormation's random part of a name it generates
IMAGE_REPOSITORY = f"{STACK}-lambda"  # docs/aws.md asks for the image's repository to carry the stack's prefix

# SAM CLI's managed stack (samcli/lib/bootstrap/bootstrap.py): a versioned, encrypted, private bucket and its policy.
SAM_MANAGED = {
    "SamCliSourceBucket": {
        "Type": "AWS::S3::Bucket",
        "Properties": {
            "PublicAccessBlockConfiguration": {"BlockPublicPolicy": "true"},
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [{}]},
            "VersioningConfiguration": {"Status": "Enabled"},
        },
    },
    "SamCliSourceBucketBucketPolicy": {
        "Type": "AWS::S3::BucketPolicy",
        "Properties": {"Bucket": {"Ref": "SamCliSourceBucket"}},
    },
}

# Actions IAM authorises against no resource ("*"): the policy may grant only these (or a statement whose condition
# names the stack) on "*".
ACCOUNT_LEVEL = {
    "application-autoscaling:DescribeScalableTargets",
    "application-autoscaling:DescribeScalingPolicies",
    "application-autoscaling:DescribeScheduledActions",
    "cloudwatch:DescribeAlarms",
    "cloudwatch:GetMetricData",
    "lambda:CreateEventSourceMapping",
    "logs:CreateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:DescribeLogGroups",
    "logs:DescribeResourcePolicies",
    "logs:GetLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:UpdateLogDelivery",
    "secretsmanager:GetRandomPassword",
}


def unused(why: str, *actions: str) -> dict[str, str]:
    return dict.fromkeys(actions, why)


KMS = "no key of the stack's own: AWS-managed keys, whose key policies let the services use them"
NOT_USED: dict[str, dict[str, str]] = {  # resource type -> action its handlers list -> why this template never needs it
    "AWS::ApplicationAutoScaling::ScalableTarget": unused(
        "no scheduled scaling",
        *("application-autoscaling:PutScheduledAction", "application-autoscaling:DeleteScheduledAction"),
    ),
    "AWS::CodeDeploy::DeploymentGroup": unused(
        "a Lambda deployment group has no instances", "codedeploy:RegisterOnPremisesInstance"
    ),
    "AWS::DynamoDB::Table": unused(
        "no import from S3, and the table's items are the functions' to write, not the deployer's",
        *("dynamodb:ImportTable", "dynamodb:DescribeImport", "s3:GetObject", "s3:GetObjectMetadata", "s3:ListBucket"),
        *("logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogGroups", "logs:DescribeLogStreams"),
        *("logs:PutLogEvents", "logs:PutRetentionPolicy", "dynamodb:BatchWriteItem", "dynamodb:DeleteItem"),
        *("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:Scan", "dynamodb:UpdateItem"),
    )
    | unused(
        "no replicas, Kinesis stream, contributor insights or resource policy",
        *("dynamodb:AssociateTableReplica", "dynamodb:CreateTableReplica", "iam:CreateServiceLinkedRole"),
        *("dynamodb:EnableKinesisStreamingDestination", "dynamodb:DisableKinesisStreamingDestination"),
        *("dynamodb:UpdateKinesisStreamingDestination", "kinesis:DescribeStream", "kinesis:PutRecords"),
        *("dynamodb:UpdateContributorInsights", "dynamodb:PutResourcePolicy", "dynamodb:DeleteResourcePolicy"),
    )
    | unused(KMS, "kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:ListAliases")
    | unused(KMS, "kms:RevokeGrant"),
    "AWS::IAM::ManagedPolicy": unused(
        "the roles name the policies they carry; a policy attaches to nothing itself",
        *("iam:AttachGroupPolicy", "iam:AttachRolePolicy", "iam:AttachUserPolicy"),
        *("iam:DetachGroupPolicy", "iam:DetachRolePolicy", "iam:DetachUserPolicy"),
    ),
    "AWS::IAM::Role": unused("SAM gives the roles managed policies only", "iam:PutRolePolicy", "iam:DeleteRolePolicy")
    | unused(
        "no permissions boundary, description or session length",
        *("iam:PutRolePermissionsBoundary", "iam:DeleteRolePermissionsBoundary"),
        *("iam:UpdateRole", "iam:UpdateRoleDescription"),
    )
    | unused(
        "SAM writes each trust policy once; a deployer who could rewrite them could take the functions' roles",
        "iam:UpdateAssumeRolePolicy",
    ),
    "AWS::Lambda::EventSourceMapping": unused(KMS, "kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey"),
    "AWS::Lambda::Function": unused(
        "the functions run outside a VPC, with no file system or capacity provider",
        *("ec2:DescribeNetworkInterfaces", "ec2:DescribeSecurityGroups", "ec2:DescribeSubnets", "ec2:DescribeVpcs"),
        *("elasticfilesystem:DescribeMountTargets", "s3files:ListMountTargets", "lambda:PassCapacityProvider"),
        "lambda:PutFunctionScalingConfig",
    )
    | unused(KMS, "kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey")
    | unused(
        "no code signing, runtime version pinning or recursion setting",
        *("lambda:GetCodeSigningConfig", "lambda:PutFunctionCodeSigningConfig", "lambda:PutFunctionRecursionConfig"),
        *(
            "lambda:DeleteFunctionCodeSigningConfig",
            "lambda:PutRuntimeManagementConfig",
            "lambda:AssociateRuntimeAlias",
        ),
    ),
    "AWS::Lambda::Version": unused(
        "no capacity provider or runtime version pinning",
        *("lambda:PutFunctionScalingConfig", "lambda:PutRuntimeManagementConfig"),
    ),
    "AWS::Logs::LogGroup": unused(
        "the logs go to CloudWatch Logs only, with a retention always, and no key, data protection, index, "
        "bearer token, deletion protection or resource policy of their own",
        *("firehose:TagDeliveryStream", "s3:REST.PUT.OBJECT", "logs:AssociateKmsKey", "logs:DisassociateKmsKey"),
        *("logs:PutDataProtectionPolicy", "logs:DeleteDataProtectionPolicy", "logs:PutIndexPolicy"),
        *("logs:DeleteIndexPolicy", "logs:PutBearerTokenAuthentication", "logs:PutLogGroupDeletionProtection"),
        *("logs:DeleteResourcePolicy", "logs:DeleteRetentionPolicy"),
    ),
    "AWS::S3::Bucket": unused(
        "bucket features the template does not set (ACLs, CORS, logging, notifications, object lock, replication, "
        "websites, analytics, inventory, metrics, tiering, metadata and S3 tables), or settings it never removes",
        *("s3:PutAccelerateConfiguration", "s3:PutAnalyticsConfiguration", "s3:DeleteBucketAnalyticsConfiguration"),
        *("s3:PutBucketAbac", "s3:PutBucketAcl", "s3:PutObjectAcl", "s3:PutBucketCORS", "s3:DeleteBucketCors"),
        *("s3:PutBucketLogging", "s3:PutBucketNotification", "s3:PutBucketObjectLockConfiguration"),
        *("s3:PutObjectLockConfiguration", "s3:PutBucketReplication", "s3:PutReplicationConfiguration"),
        *("s3:DeleteBucketReplication", "s3:PutBucketWebsite", "s3:DeleteBucketWebsite"),
        *("s3:PutIntelligentTieringConfiguration", "s3:PutInventoryConfiguration", "s3:PutMetricsConfiguration"),
        *("s3:DeleteBucketMetricsConfiguration", "s3:CreateBucketMetadataTableConfiguration"),
        *("s3:DeleteBucketMetadataTableConfiguration", "s3:UpdateBucketMetadataAnnotationTableConfiguration"),
        *("s3:UpdateBucketMetadataInventoryTableConfiguration", "s3:UpdateBucketMetadataJournalTableConfiguration"),
        *("s3:DeleteBucketEncryption", "s3:DeleteBucketLifecycle", "s3:DeleteObject"),
        *("s3tables:CreateNamespace", "s3tables:CreateTable", "s3tables:CreateTableBucket", "s3tables:GetTable"),
        *("s3tables:GetTableMetadataLocation", "s3tables:PutTableBucketPolicy", "s3tables:PutTableEncryption"),
        *("s3tables:PutTablePolicy", "s3tables:UpdateTableMetadataLocation"),
    ),
    "AWS::SecretsManager::Secret": unused(
        "no replica regions", "secretsmanager:ReplicateSecretToRegions", "secretsmanager:RemoveRegionsFromReplication"
    ),
}

# Calls a resource's deployment makes that its schema does not list.
HTTP_API_LOGS = "the HTTP API's access logs to CloudWatch Logs (API Gateway's documented requirement)"
IMAGE = (
    "a function from a container image: Lambda reads it with the caller's rights, and may set its repository's policy"
)
EXTRA: dict[str, dict[str, str]] = {
    "AWS::ApiGatewayV2::Stage": unused(
        HTTP_API_LOGS,
        *("logs:CreateLogDelivery", "logs:DeleteLogDelivery", "logs:DescribeResourcePolicies", "logs:GetLogDelivery"),
        *("logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:UpdateLogDelivery", "logs:DescribeLogGroups"),
    ),
    "AWS::Lambda::Function": unused(
        IMAGE, "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:GetRepositoryPolicy", "ecr:SetRepositoryPolicy"
    ),
}


class Need(NamedTuple):
    action: str
    arn: str
    why: str


@dataclass(frozen=True)
class Created:
    """A resource a deploy creates: in which stack, and which of its handlers CloudFormation runs."""

    logical: str
    kind: str
    properties: dict[str, Any]
    stack: str
    phases: tuple[str, ...]
    update_policy: dict[str, Any]

    @property
    def service(self) -> str:
        prefix = self.kind.split("::")[1].lower()
        return {"apigatewayv2": "apigateway", "applicationautoscaling": "application-autoscaling"}.get(prefix, prefix)


@functools.cache
def created() -> dict[str, Created]:
    """template.yaml as SAM translates it for CloudFormation (its code at SAM's bucket), and SAM CLI's managed stack."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_DEFAULT_REGION", REGION)  # the translator fills in AWS::Region
        resources = translated(lambda path: f"s3://{SAM_BUCKET}/{ARTIFACTS_PREFIX}/{path.replace('/', '-')}")
    found = {}
    for logical, resource in resources["Resources"].items():
        retained = resource.get("DeletionPolicy") == "Retain"  # `sam delete` leaves it: no delete handler
        phases = ("create", "read", "update") if retained else ("create", "read", "update", "delete")
        properties, update = resource.get("Properties") or {}, resource.get("UpdatePolicy", {})
        found[logical] = Created(logical, resource["Type"], properties, STACK, phases, update)
    for logical, resource in SAM_MANAGED.items():  # created once, then only read
        found[logical] = Created(logical, resource["Type"], resource["Properties"], SAM_STACK, ("create", "read"), {})
    return found


# -- the names and ARNs CloudFormation gives what it creates ------------------------------------------------------


def name(resource: Created) -> str:
    if "LayerName" in resource.properties:
        (value,) = values(resource.properties["LayerName"])
        return value
    if resource.kind == "AWS::SecretsManager::Secret":
        return f"{resource.logical}-{SUFFIX}"  # no stack name in it
    generated = f"{resource.stack}-{resource.logical}-{SUFFIX}"
    return generated.lower() if resource.kind == "AWS::S3::Bucket" else generated


def log_group_names(resource: Created) -> list[str]:
    if "LogGroupName" in resource.properties:
        return values(resource.properties["LogGroupName"])
    return [name(resource)]


def arns(logical: str) -> list[str]:
    """The ARNs the resource may have (one per branch of a condition that picks between resources)."""
    resource = created()[logical]
    props, kind = resource.properties, resource.kind
    lam, here = f"arn:aws:lambda:{REGION}:{ACCOUNT}", f"{REGION}:{ACCOUNT}"
    api = f"arn:aws:apigateway:{REGION}::/apis/APIID"
    match kind:
        case "AWS::Lambda::Function":
            return [f"{lam}:function:{name(resource)}"]
        case "AWS::Lambda::Version":
            return [f"{lam}:function:{function}:1" for function in values(props["FunctionName"])]
        case "AWS::Lambda::Alias":
            return [f"{lam}:function:{function}:{props['Name']}" for function in values(props["FunctionName"])]
        case "AWS::Lambda::Permission":
            return values(props["FunctionName"])
        case "AWS::Lambda::EventSourceMapping":
            return [f"{lam}:event-source-mapping:uuid"]
        case "AWS::Lambda::LayerVersion":
            return [f"{lam}:layer:{name(resource)}:1"]
        case "AWS::IAM::Role":
            return [f"arn:aws:iam::{ACCOUNT}:role/{name(resource)}"]
        case "AWS::IAM::ManagedPolicy":
            return [f"arn:aws:iam::{ACCOUNT}:policy/{name(resource)}"]
        case "AWS::SQS::Queue":
            return [f"arn:aws:sqs:{here}:{name(resource)}"]
        case "AWS::DynamoDB::Table":
            return [f"arn:aws:dynamodb:{here}:table/{name(resource)}"]
        case "AWS::S3::Bucket":
            return [f"arn:aws:s3:::{name(resource)}"]
        case "AWS::S3::BucketPolicy":
            return [f"arn:aws:s3:::{bucket}" for bucket in values(props["Bucket"])]
        case "AWS::Logs::LogGroup":
            return [f"arn:aws:logs:{here}:log-group:{group}" for group in log_group_names(resource)]
        case "AWS::CloudWatch::Alarm":
            return [f"arn:aws:cloudwatch:{here}:alarm:{name(resource)}"]
        case "AWS::SecretsManager::Secret":
            return [f"arn:aws:secretsmanager:{here}:secret:{name(resource)}-AbCdEf"]
        case "AWS::ApiGatewayV2::Api":
            return [api]
        case "AWS::ApiGatewayV2::Stage":
            return [f"{api}/stages/{props['StageName']}"]
        case "AWS::ApiGatewayV2::Route" | "AWS::ApiGatewayV2::Integration" | "AWS::ApiGatewayV2::Authorizer":
            return [f"{api}/{kind.rpartition('::')[2].lower()}s/ID"]
        case "AWS::ApplicationAutoScaling::ScalableTarget":
            return [f"arn:aws:application-autoscaling:{here}:scalable-target/ID"]
        case "AWS::ApplicationAutoScaling::ScalingPolicy":
            return arns(props["ScalingTargetId"]["Ref"])
        case "AWS::CodeDeploy::Application":
            return [f"arn:aws:codedeploy:{here}:application:{name(resource)}"]
        case "AWS::CodeDeploy::DeploymentGroup":
            return [
                f"arn:aws:codedeploy:{here}:deploymentgroup:{app}/{name(resource)}"
                for app in values(props["ApplicationName"])
            ]
    raise AssertionError(f"{logical}: no ARN rule for {kind}; add one")


def ref(logical: str) -> str:
    """What ``Ref`` of the resource gives, where the template uses it in a name or an ARN."""
    resource = created()[logical]
    by_arn = ("AWS::Lambda::Alias", "AWS::Lambda::Version", "AWS::Lambda::LayerVersion", "AWS::IAM::ManagedPolicy")
    return arns(logical)[0] if resource.kind in by_arn else name(resource)


def values(node: Any) -> list[str]:
    """Every value an intrinsic may take (both branches of an ``Fn::If``), for the ones the names above use."""
    if isinstance(node, str):
        return [node]
    ((key, arg),) = node.items()
    if key == "Ref":
        return [{"AWS::StackName": STACK, "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}.get(arg) or ref(arg)]
    if key == "Fn::GetAtt" and arg[1] == "Arn":
        return arns(arg[0])
    if key == "Fn::If":
        return [v for branch in arg[1:] if branch != {"Ref": "AWS::NoValue"} for v in values(branch)]
    if key == "Fn::Sub":
        text, variables = (arg, {}) if isinstance(arg, str) else arg
        while "${" in text:
            start = text.index("${")
            variable = text[start + 2 : text.index("}", start)]
            reference = {"Fn::GetAtt": variable.split(".")} if "." in variable else {"Ref": variable}
            (value,) = values(variables.get(variable, reference))
            text = text.replace("${" + variable + "}", value)
        return [text]
    raise AssertionError(f"no rule for {key} in a name")


def referenced(node: Any) -> set[str]:
    """The logical ids a property refers to, however deep."""
    if isinstance(node, dict):
        if set(node) == {"Ref"} and isinstance(node["Ref"], str):
            return {node["Ref"]}
        if set(node) == {"Fn::GetAtt"}:
            return {node["Fn::GetAtt"][0]}
        return set().union(*(referenced(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(referenced(v) for v in node))
    return set()


# -- what each resource's handlers act on -------------------------------------------------------------------------


def targets(action: str, resource: Created, phase: str) -> list[str]:
    """The ARNs ``action`` acts on when CloudFormation runs ``phase`` for ``resource`` ([] where it takes none)."""
    props, service = resource.properties, action.split(":")[0]
    resources = created()
    if action == "iam:PassRole":
        roles = [props[key] for key in ("Role", "ServiceRoleArn", "RoleARN") if key in props]
        return [arn for role in roles for arn in values(role)]
    if service == "s3" and action.lower() in ("s3:getobject", "s3:getobjectversion") and resource.service != "s3":
        code = props.get("Code") or props.get("Content") or props.get("BodyS3Location") or {}
        return [f"arn:aws:s3:::{code['S3Bucket']}/{code['S3Key']}"] if "S3Bucket" in code else []
    if service == "ecr":
        image = "ImageUri" in props.get("Code", {})
        return [f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{IMAGE_REPOSITORY}"] if image else []
    if action in ACCOUNT_LEVEL:
        return ["*"]
    if resource.kind == "AWS::Lambda::Function" and action == "lambda:GetLayerVersion":
        return [arn for layer in props.get("Layers", []) for arn in values(layer)]
    if resource.kind == "AWS::ApplicationAutoScaling::ScalableTarget":
        named = [alias for alias in referenced(props["ResourceId"]) if resources[alias].kind == "AWS::Lambda::Alias"]
        aliases = [arn for alias in named for arn in arns(alias)]
        if service == "lambda":
            return aliases
        if service == "cloudwatch":  # the target-tracking alarms it makes on the alias's utilisation
            alarm = f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:TargetTracking"
            return [f"{alarm}-{arn.split(':', 5)[5]}-AlarmHigh" for arn in aliases]
        if action == "iam:CreateServiceLinkedRole":
            service_linked = "lambda.application-autoscaling.amazonaws.com"
            role = "AWSServiceRoleForApplicationAutoScaling_LambdaConcurrency"
            return [f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/{service_linked}/{role}"]
    if service == "codedeploy" and resource.kind == "AWS::Lambda::Alias":  # a rollout: SAM's UpdatePolicy on it
        rollout = resource.update_policy.get("CodeDeployLambdaAliasUpdate")
        groups = [resources[group] for group in referenced(rollout["DeploymentGroupName"])] if rollout else []
        if action == "codedeploy:GetDeploymentConfig":
            return [arn for group in groups for arn in deployment_configs(group)]
        return [arn for group in groups for arn in arns(group.logical)]
    if resource.kind == "AWS::CodeDeploy::DeploymentGroup":
        if action == "codedeploy:GetDeploymentConfig":
            return deployment_configs(resource)
        if action in ("codedeploy:GetApplicationRevision", "codedeploy:RegisterApplicationRevision"):
            return [f"arn:aws:codedeploy:{REGION}:{ACCOUNT}:application:{a}" for a in values(props["ApplicationName"])]
    if resource.kind == "AWS::ApiGatewayV2::Api" and phase == "create":
        return [f"arn:aws:apigateway:{REGION}::/apis"]
    if service == resource.service:
        return arns(resource.logical)
    raise AssertionError(f"{resource.logical}: {action} acts on what? Add a target rule, or a NOT_USED entry")


def deployment_configs(group: Created) -> list[str]:
    configs = values(group.properties["DeploymentConfigName"])
    return [f"arn:aws:codedeploy:{REGION}:{ACCOUNT}:deploymentconfig:{config}" for config in configs]


def schema_permissions(kind: str) -> dict[str, list[str]]:
    """The permissions CloudFormation's resource schema lists for each handler of ``kind`` (us-east-1's)."""
    import cfnlint

    schemas = os.path.join(os.path.dirname(cfnlint.__file__), "data", "schemas")
    with open(os.path.join(schemas, "providers", "us-east-1.json")) as f:
        digest = json.load(f)[kind]
    with open(os.path.join(schemas, "resources", f"{digest}.json")) as f:
        schema = json.load(f)
    handlers = {phase: h.get("permissions", []) for phase, h in schema.get("handlers", {}).items()}
    handlers["tagging"] = schema.get("tagging", {}).get("permissions", [])
    return handlers


def resource_needs() -> Iterator[Need]:
    for resource in created().values():
        handlers = schema_permissions(resource.kind)
        skipped = NOT_USED.get(resource.kind, {})
        phases = [*resource.phases, "tagging"]
        for phase in phases:
            for action in [*handlers.get(phase, []), *(EXTRA.get(resource.kind, {}) if phase == "create" else [])]:
                if action in skipped:
                    continue
                if resource.kind == "AWS::ApiGatewayV2::Stage" and action.startswith("logs:"):
                    if "AccessLogSettings" not in resource.properties:
                        continue
                for arn in targets(action, resource, phase):
                    yield Need(action, arn, f"{resource.logical} ({resource.kind}) {phase}")


def sam_cli_needs() -> list[Need]:
    """What SAM CLI itself calls: change sets of the stack (and of its managed stack, through the SAM transform), the
    artifacts it uploads and `sam delete` removes, and the image functions' companion stack `sam delete` looks for."""
    cfn = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}"
    stack, managed = f"{cfn}:stack/{STACK}/id", f"{cfn}:stack/{SAM_STACK}/id"
    transform = f"arn:aws:cloudformation:{REGION}:aws:transform/Serverless-2016-10-31"
    artifact = f"arn:aws:s3:::{SAM_BUCKET}/{ARTIFACTS_PREFIX}/0123abcd.template"
    deploy = ["CreateChangeSet", "DescribeChangeSet", "ExecuteChangeSet", "DescribeStacks", "DescribeStackEvents"]
    return [
        *(Need(f"cloudformation:{a}", stack, "sam deploy") for a in [*deploy, "GetTemplateSummary"]),
        *(Need(f"cloudformation:{a}", stack, "sam delete") for a in ["GetTemplate", "ListChangeSets", "DeleteStack"]),
        Need("cloudformation:CreateChangeSet", transform, "the SAM transform"),
        *(Need(f"cloudformation:{a}", managed, "sam deploy --resolve-s3, once") for a in [*deploy[:4], "TagResource"]),
        Need("cloudformation:DescribeStacks", f"{cfn}:stack/{STACK}-0a1b2c3d-CompanionStack/id", "sam delete"),
        *(Need(f"s3:{a}", artifact, "sam deploy") for a in ["PutObject", "GetObject"]),
        Need("s3:DeleteObject", artifact, "sam delete"),
        Need("s3:ListBucket", f"arn:aws:s3:::{SAM_BUCKET}", "sam delete lists the artifacts"),
    ]


@functools.cache
def needs() -> tuple[Need, ...]:
    return (*resource_needs(), *sam_cli_needs())


# -- the policy ----------------------------------------------------------------------------------------------------


def listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def grants(statement: dict[str, Any], action: str, arn: str) -> bool:
    actions, resources = listed(statement["Action"]), listed(statement["Resource"])
    if not any(fnmatchcase(action.lower(), a.lower()) for a in actions):  # IAM's actions ignore case, ARNs do not
        return False
    return any(r == "*" or (arn != "*" and fnmatchcase(arn, r)) for r in resources)


def unmet(statements: list[dict[str, Any]]) -> list[Need]:
    return [need for need in needs() if not any(grants(s, need.action, need.arn) for s in statements)]


def test_every_resource_the_template_creates_can_be_created_updated_and_deleted() -> None:
    kinds = {resource.kind for resource in created().values()}
    assert {"AWS::Lambda::Alias", "AWS::IAM::Role", "AWS::CodeDeploy::DeploymentGroup", "AWS::S3::Bucket"} <= kinds
    missing = unmet(STATEMENTS)
    assert not missing, "the policies do not grant:\n" + "\n".join(f"  {n.action} on {n.arn}: {n.why}" for n in missing)


def test_it_grants_nothing_the_deploy_does_not_need_and_no_wildcard_action() -> None:
    assert all(set(policy) == {"Version", "Statement"} for policy in POLICIES.values())
    assert all(policy["Version"] == "2012-10-17" for policy in POLICIES.values())
    assert all(set(s) <= {"Sid", "Effect", "Action", "Resource", "Condition"} for s in STATEMENTS)  # no NotAction
    assert all(s["Effect"] == "Allow" for s in STATEMENTS)
    granted = {a for s in STATEMENTS for a in listed(s["Action"])}
    assert not [a for a in granted if "*" in a or "?" in a], "an action with a wildcard"
    needed = {n.action.lower() for n in needs()}
    assert not sorted(a for a in granted if a.lower() not in needed), "granted, and nothing in the deploy needs it"
    services = {a.split(":")[0] for a in granted}
    assert services <= {n.action.split(":")[0] for n in needs()}, "a service the template does not use"


def test_every_statement_is_needed() -> None:
    """Drop any one statement and the deploy misses something: none is redundant, and the check above can fail."""
    for index, statement in enumerate(STATEMENTS):
        assert unmet(STATEMENTS[:index] + STATEMENTS[index + 1 :]), f"{statement['Sid']} grants nothing needed"


def test_it_reaches_only_this_stacks_resources() -> None:
    """Where CloudFormation's names carry the stack's, another stack's resources are out of reach; "*" only for
    actions IAM authorises on no resource, or under a condition that names the stack."""
    other = [
        (n, n.arn.replace(f"stack/{STACK}/", "stack/other/").replace(f"{STACK}-", "other-"))
        for n in needs()
        if f"stack/{STACK}/" in n.arn or f"{STACK}-" in n.arn
    ]
    assert len(other) > 100
    reached = [f"{n.action} on {arn}" for n, arn in other if any(grants(s, n.action, arn) for s in STATEMENTS)]
    assert not reached, "reaches another stack's resources:\n" + "\n".join(reached)
    for statement in STATEMENTS:
        if "*" in listed(statement["Resource"]):
            scoped = f"function:{STACK}-" in json.dumps(statement.get("Condition", {}))
            assert scoped or set(listed(statement["Action"])) <= ACCOUNT_LEVEL, statement["Sid"]


def conditioned(action: str) -> dict[str, Any]:
    (statement,) = [s for s in STATEMENTS if action in listed(s["Action"]) and "Condition" in s]
    return dict(statement["Condition"])


def test_the_conditions_let_roles_take_only_the_templates_policies_and_go_only_to_its_services() -> None:
    roles = [r for r in created().values() if r.kind == "AWS::IAM::Role"]
    arns = [arn for r in roles for arn in r.properties.get("ManagedPolicyArns", [])]
    own = any(not isinstance(arn, str) for arn in arns)  # a Ref to one of the template's managed policies
    expected = {arn for arn in arns if isinstance(arn, str)} | ({f"arn:aws:iam::*:policy/{STACK}-*"} if own else set())
    for action in ("iam:AttachRolePolicy", "iam:DetachRolePolicy"):
        assert set(conditioned(action)["ArnLike"]["iam:PolicyARN"]) == expected
    trusted = {
        service
        for r in roles
        for statement in r.properties["AssumeRolePolicyDocument"]["Statement"]
        for service in listed(statement["Principal"]["Service"])
    }
    assert set(conditioned("iam:PassRole")["StringEquals"]["iam:PassedToService"]) == trusted
    scaled = {r.properties["ServiceNamespace"] for r in created().values() if r.kind.endswith("ScalableTarget")}
    assert scaled == {"lambda"}
    assert conditioned("iam:CreateServiceLinkedRole") == {
        "StringEquals": {"iam:AWSServiceName": "lambda.application-autoscaling.amazonaws.com"}
    }
    triggers = {"ArnLike": {"lambda:FunctionArn": f"arn:aws:lambda:*:*:function:{STACK}-*"}}
    assert conditioned("lambda:CreateEventSourceMapping") == triggers


def test_no_statement_is_in_two_places() -> None:
    """A statement twice (by its Sid, or by what it grants), in one file or across two, would be edited in one place
    and left as it was in the other."""
    sids = [s["Sid"] for s in STATEMENTS]
    assert len(set(sids)) == len(sids), sorted({sid for sid in sids if sids.count(sid) > 1})
    bodies = [json.dumps({k: v for k, v in s.items() if k != "Sid"}, sort_keys=True) for s in STATEMENTS]
    assert len(set(bodies)) == len(bodies), "two statements grant the same"


# -- what IAM accepts ----------------------------------------------------------------------------------------------

MANAGED_POLICY_LIMIT = 6_144  # IAM's hard limit, in characters; an inline role policy's is 10,240


def iam_size(document: Any) -> int:
    """A policy's size as IAM counts it: whitespace between the JSON's tokens is not counted, within strings it is."""
    return len(json.dumps(document, separators=(",", ":"), ensure_ascii=False))


def policy_documents() -> dict[str, Any]:
    """Every IAM policy under infra/ (a JSON file with a Statement), by path."""
    documents = {}
    for path in sorted((REPO / "infra").rglob("*.json")):
        document = json.loads(path.read_text())
        if isinstance(document, dict) and "Statement" in document:
            documents[path.relative_to(REPO).as_posix()] = document
    return documents


def test_every_policy_under_infra_is_one_iam_accepts() -> None:
    """Each is created as a managed policy (docs/aws-permissions.md), whose limit is the lower."""
    assert iam_size({"Sid": "a b"}) == len('{"Sid":"a b"}')  # the space inside a string counts
    documents = policy_documents()
    assert {f"infra/aws/deployer/{name}" for name in POLICIES} <= set(documents)
    over = {path: size for path, document in documents.items() if (size := iam_size(document)) > MANAGED_POLICY_LIMIT}
    assert not over, f"over the {MANAGED_POLICY_LIMIT} characters IAM allows a managed policy: {over}"


def test_the_permissions_page_creates_every_file() -> None:
    page = (REPO / "docs" / "aws-permissions.md").read_text()
    assert "for policy in infra/aws/deployer/*.json" in page
    assert len(POLICIES) >= 2 and all(f"`{name}`" in page for name in POLICIES), "a file the page does not describe"
