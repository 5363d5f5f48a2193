"""The emulator's AWS: an embedded moto server (or the configured endpoint) and the template's resources.

Queues (dead-letter queues first, so redrive policies can name them), tables (with their
TTL) and buckets are created under local names; the returned maps resolve the template's
``Ref`` and ``Fn::GetAtt`` to them.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

from fnserve.adapters.local.events import REGION, arn
from fnserve.adapters.local.template import Resolver, Template
from fnserve.aws import clients

Physical = dict[str, str]
Attributes = dict[tuple[str, str], str]


def start_aws() -> tuple[str, Any]:
    """The AWS endpoint every client will use, and the embedded moto server started for it (or None).

    With ``AWS_ENDPOINT_URL`` or LocalStack configured, that endpoint; else a moto server on
    127.0.0.1, never on another interface. Region and credentials default to harmless local values.
    """
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "local")
    endpoint = clients.endpoint_url("sqs")
    server = None
    if endpoint is None:
        from moto.server import ThreadedMotoServer

        from fnserve.adapters.local import moto_sqs

        moto_sqs.apply()  # deep queues at the cost of shallow ones
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per AWS call
        port = _free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    clients.reset()
    return endpoint, server


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
        dynamodb.create_table(
            TableName=table,
            KeySchema=props["KeySchema"],
            AttributeDefinitions=props["AttributeDefinitions"],
            BillingMode="PAY_PER_REQUEST",
        )
        ttl = props.get("TimeToLiveSpecification")
        if ttl and ttl.get("Enabled"):
            dynamodb.update_time_to_live(TableName=table, TimeToLiveSpecification=ttl)
        physical[name] = table
        attributes[(name, "Arn")] = arn("dynamodb", f"table/{table}")
    s3 = clients.client("s3")
    for name in template.of_type("AWS::S3::Bucket"):
        bucket = f"fnserve-local-{name.lower()}"
        s3.create_bucket(Bucket=bucket)
        physical[name] = bucket
        attributes[(name, "Arn")] = arn("s3", bucket)
    return physical, attributes


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
        url = sqs.create_queue(QueueName=f"fnserve-local-{name}", Attributes=attrs)["QueueUrl"]
        physical[name] = url
        queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        attributes[(name, "Arn")] = queue_arn
        attributes[(name, "QueueName")] = url.rsplit("/", 1)[-1]
