"""The emulator's AWS: an embedded moto server (or the configured endpoint) and the template's resources.

Queues (dead-letter queues first, so redrive policies can name them), tables (with their
TTL), buckets and secrets (with a generated value) are created under local names; the
returned maps resolve the template's ``Ref`` and ``Fn::GetAtt`` to them. Against an endpoint that outlives the emulator
(LocalStack), a restart finds them there: they are reused, with the template's settings
applied again, and their data kept.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from typing import Any

from fnserve.aws import clients
from fnserve.aws.events import REGION, arn
from fnserve.core.errors import ConfigError
from fnserve.emulator.template import Resolver, Template

logger = logging.getLogger(__name__)
Physical = dict[str, str]
Attributes = dict[tuple[str, str], str]


def start_aws(port: int | None = None) -> tuple[str, Any]:
    """The AWS endpoint every client will use, and the embedded moto server started for it (or None).

    With ``AWS_ENDPOINT_URL`` or LocalStack configured, that endpoint; else a moto server on
    127.0.0.1, never on another interface, on ``port`` (so that its queue URLs, which a reader copies,
    stay the same from one start to the next), or on a free port when that one is taken or None.
    Region and credentials default to harmless local values.
    """
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "local")
    endpoint = clients.endpoint_url("sqs")
    server = None
    if endpoint is None:
        from moto.server import ThreadedMotoServer

        from fnserve.emulator import moto_sqs

        moto_sqs.apply()  # deep queues at the cost of shallow ones
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per AWS call
        if port is None or not _free(port):
            if port is not None:
                logger.warning("port %d is taken: the embedded AWS emulator listens on another one", port)
            port = _free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    clients.reset()
    return endpoint, server


def _free(port: int) -> bool:
    """Whether a server can listen on ``port`` (as servers bind: a previous run's closed connections are no bar)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_resources(
    template: Template, parameters: dict[str, str], visibility_timeout: int | None = None
) -> tuple[Physical, Attributes]:
    """Create the template's queues, tables and buckets; returns their physical names and attributes."""
    physical: Physical = {}
    attributes: Attributes = {}
    plain = Resolver(template, physical, attributes, parameters)
    _queues(template, plain, visibility_timeout, physical, attributes)
    dynamodb = clients.client("dynamodb")
    for name, resource in template.of_type("AWS::DynamoDB::Table").items():
        props = plain.resolve(resource.get("Properties", {}))
        table = f"fnserve-local-{name}"
        try:
            dynamodb.create_table(
                TableName=table,
                KeySchema=props["KeySchema"],
                AttributeDefinitions=props["AttributeDefinitions"],
                BillingMode="PAY_PER_REQUEST",
            )
        except dynamodb.exceptions.ResourceInUseException:
            _check_key_schema(dynamodb, table, props["KeySchema"])
        ttl = props.get("TimeToLiveSpecification")
        if ttl and ttl.get("Enabled"):
            current = dynamodb.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
            if current.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
                dynamodb.update_time_to_live(TableName=table, TimeToLiveSpecification=ttl)
        physical[name] = table
        attributes[(name, "Arn")] = arn("dynamodb", f"table/{table}")
    secrets_manager = clients.client("secretsmanager")
    for name, resource in template.of_type("AWS::SecretsManager::Secret").items():
        physical[name] = _secret(secrets_manager, f"fnserve-local-{name}", resource.get("Properties", {}))
    s3 = clients.client("s3")
    for name in template.of_type("AWS::S3::Bucket"):
        bucket = f"fnserve-local-{name.lower()}"
        try:
            s3.create_bucket(Bucket=bucket)
        except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            pass  # this emulator's, from an earlier run
        physical[name] = bucket
        attributes[(name, "Arn")] = arn("s3", bucket)
    return physical, attributes


def _secret(secrets_manager: Any, name: str, props: dict[str, Any]) -> str:
    """A secret's ARN (what ``Ref`` gives): made with a generated value as GenerateSecretString asks, or
    the template's SecretString; one from an earlier run against the same endpoint is reused."""
    try:
        return str(secrets_manager.describe_secret(SecretId=name)["ARN"])
    except secrets_manager.exceptions.ResourceNotFoundException:
        pass
    value = props.get("SecretString")
    if not isinstance(value, str):
        length = int((props.get("GenerateSecretString") or {}).get("PasswordLength", 32))
        value = secrets.token_urlsafe(length)[:length]
    return str(secrets_manager.create_secret(Name=name, SecretString=value)["ARN"])


def _check_key_schema(dynamodb: Any, table: str, key_schema: list[dict[str, str]]) -> None:
    """An existing table is reused only if its key is the template's (its items could not be read otherwise)."""
    existing = dynamodb.describe_table(TableName=table)["Table"]["KeySchema"]
    if sorted(map(str, existing)) != sorted(map(str, key_schema)):
        raise ConfigError(
            f"table {table} exists with key {existing}, not the template's {key_schema}: delete it and start again"
        )


def _queues(
    template: Template,
    plain: Resolver,
    visibility_timeout: int | None,
    physical: Physical,
    attributes: Attributes,
) -> None:
    sqs = clients.client("sqs")
    queues = template.of_type("AWS::SQS::Queue")
    # Dead-letter queues first: a redrive policy names its DLQ's ARN.
    for name in sorted(queues, key=lambda n: "RedrivePolicy" in queues[n].get("Properties", {})):
        props = queues[name].get("Properties", {})
        attrs = {}
        timeout = visibility_timeout or props.get("VisibilityTimeout")
        if timeout is not None:
            attrs["VisibilityTimeout"] = str(plain.resolve(timeout))
        if "RedrivePolicy" in props:
            redrive = plain.resolve(props["RedrivePolicy"])
            attrs["RedrivePolicy"] = json.dumps(
                {
                    "deadLetterTargetArn": redrive["deadLetterTargetArn"],
                    "maxReceiveCount": str(redrive["maxReceiveCount"]),
                }
            )
        queue_name = f"fnserve-local-{name}"
        try:
            url = sqs.create_queue(QueueName=queue_name, Attributes=attrs)["QueueUrl"]
        except sqs.exceptions.QueueNameExists:  # from an earlier run, with other attributes: this run's apply
            url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
            if attrs:
                sqs.set_queue_attributes(QueueUrl=url, Attributes=attrs)
        physical[name] = url
        queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        attributes[(name, "Arn")] = queue_arn
        attributes[(name, "QueueName")] = url.rsplit("/", 1)[-1]
