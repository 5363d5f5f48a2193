"""``eval "$(fnserve outputs)"`` sets a deployed stack's outputs as the shell variables the docs use, read from a
stack that moto's CloudFormation created; a stack that is not there is one line saying so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode.cfn_yaml import load

from tests.helpers import REPO
from tests.moto import aws_env, reset

FNSERVE = str(Path(sys.executable).parent / "fnserve")
OUTPUTS = list(load(str(REPO / "template.yaml"))["Outputs"])


def stack_with_the_templates_outputs() -> str:
    """A template moto can create whose outputs carry template.yaml's keys, one a quoted value, one a GetAtt."""
    outputs = {key: {"Value": f"value of {key}"} for key in OUTPUTS}
    outputs["JobsQueueUrl"] = {"Value": {"Ref": "Jobs"}}
    outputs["JobsDeadLetterQueueArn"] = {"Value": {"Fn::GetAtt": ["Jobs", "Arn"]}}
    outputs["ApiUrl"] = {"Value": "https://example.com/it's $(quoted)"}  # a shell must not run or split it
    return json.dumps({"Resources": {"Jobs": {"Type": "AWS::SQS::Queue"}}, "Outputs": outputs})


def run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euc", script], env=env, capture_output=True, text=True, timeout=60)


def test_the_outputs_become_shell_variables_with_their_own_names(
    moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    reset(moto_url)
    for key, value in aws_env(moto_url).items():
        monkeypatch.setenv(key, value)
    env = {**os.environ, "PATH": f"{Path(FNSERVE).parent}:{os.environ['PATH']}"}
    env.pop("LOCALSTACK_HOST", None)
    boto3.client("cloudformation").create_stack(StackName="fnserve", TemplateBody=stack_with_the_templates_outputs())
    assert shutil.which("fnserve", path=env["PATH"])

    echoed = run('eval "$(fnserve outputs)"; ' + "; ".join(f'echo "{key}=${key}"' for key in OUTPUTS), env)
    assert echoed.returncode == 0, echoed.stderr
    values = dict(line.split("=", 1) for line in echoed.stdout.splitlines())
    assert list(values) == OUTPUTS
    assert values["ApiUrl"] == "https://example.com/it's $(quoted)"
    assert "Jobs" in values["JobsQueueUrl"].rsplit("/", 1)[1]  # the queue moto made, by its URL
    assert values["JobsDeadLetterQueueArn"].startswith("arn:aws:sqs:us-east-1:")
    assert values["ResultsTableName"] == "value of ResultsTableName"


def test_a_stack_that_is_not_there_is_one_line(moto_url: str) -> None:
    stack = "nope"
    reset(moto_url)
    env = {**os.environ, **aws_env(moto_url)}
    env.pop("LOCALSTACK_HOST", None)
    done = subprocess.run(
        [FNSERVE, "outputs", "--stack-name", stack], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert f"no stack {stack!r}" in done.stderr and "Traceback" not in done.stderr
