"""Prove the packaged artifact, not just the source: after `sam build`, run every built function
on one of its events/ files under python3.12 with only the built layers on the path, against a
real moto server; print the unzipped sizes against Lambda's limits. Exits non-zero on any failure.

    python -m tests.package.check_package PYTHON312 [BUILD_DIR]        (make sam-check runs it)
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fnserve.aws import clients
from tests.helpers import DEMO_MANIFEST, REPO
from tests.helpers.clouds import create_resources
from tests.moto import aws_env, moto_server

LAMBDA_LIMIT = 250 * 1024 * 1024
# The runtime layer's budget, leaving a models layer 50 MB: pipelines' Pillow (23 MB) and tokenizers (12 MB) included.
LAYER_TARGET = 200 * 1024 * 1024
CHECKS = [  # (function, event, what a good response looks like)
    ("ApiFunction", "api-http-infer.json", lambda r: r["statusCode"] == 200 and "label" in r["body"]),
    # The pipelines: tokenizers and Pillow from the built layer, under the runtime's Python.
    ("ApiFunction", "api-http-embed.json", lambda r: r["statusCode"] == 200 and '"shape":[2,384]' in r["body"]),
    ("ApiFunction", "api-http-image.json", lambda r: r["statusCode"] == 200 and '"seven"' in r["body"]),
    # The samples' poison job is its own fault: stored as failed, not reported for redelivery.
    ("BatchFunction", "batch-jobs.json", lambda r: r == {"batchItemFailures": []}),
    ("FollowupFunction", "followup-jobs.json", lambda r: r == {"batchItemFailures": []}),
    # The sample's key is not the stack's: refused, the secret read through the built layer's Powertools.
    ("ApiKeyAuthorizerFunction", "api-authorizer.json", lambda r: r == {"isAuthorized": False}),
]


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def uncompiled(layer: Path, python312: str) -> int:
    """1 (and says which) when a module of the layer has no bytecode for the runtime's Python, else 0.

    Lambda's /opt is read-only: a module without its .pyc is compiled again on every cold start.
    """
    tag = subprocess.run(
        [python312, "-c", "import sys; print(sys.implementation.cache_tag)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    missing = [
        source
        for source in layer.rglob("*.py")
        if not (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").exists()
    ]
    if missing:
        print(f"FAIL the runtime layer has {len(missing)} modules without {tag} bytecode, e.g. {missing[0]}")
        return 1
    print(f"ok   every module of the runtime layer has its {tag} bytecode (compiled at build)")
    return 0


def main(python312: str, build: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="fnserve-lambda-runtime-") as runtime:  # 37 MB: not left behind
        return check(python312, build, Path(runtime))


def check(python312: str, build: Path, runtime: Path) -> int:
    # boto3 is part of the Lambda runtime, not of the layer: install it beside, as Lambda provides it.
    subprocess.run([python312, "-m", "pip", "install", "-q", "--target", str(runtime), "boto3"], check=True)
    layer = build / "FnserveLayer" / "python"
    models = REPO / "layers" / "models"  # packaged as is: it lands at /opt/models
    failures = uncompiled(layer, python312)
    sizes = {"FnserveLayer": size(build / "FnserveLayer"), "ModelsLayer": size(models)}
    with moto_server(runtime / "moto.log") as url:
        env = {**os.environ, **aws_env(url)}
        os.environ.update(aws_env(url))
        clients.reset()
        create_resources("package-results", "package-payloads", "package-followups")
        keys = clients.client("secretsmanager").create_secret(Name="package-api-keys", SecretString="fns-" + "k" * 40)
        env |= {
            "PYTHONPATH": f"{layer}:{runtime}",
            "FNSERVE_MANIFEST": str(models / DEMO_MANIFEST.relative_to(models)),
            "FNSERVE_RESULTS_TABLE": "package-results",
            "FNSERVE_RESULTS_BUCKET": "package-payloads",
            "POWERTOOLS_METRICS_NAMESPACE": "fnserve",
            "PYTHONNOUSERSITE": "1",
            "FNSERVE_API_KEYS_SECRET": keys["ARN"],
        }
        for function, event, good in CHECKS:
            directory = build / function
            sizes[function] = size(directory)
            done = subprocess.run(
                [
                    python312,
                    str(REPO / "tests" / "package" / "invoke_built.py"),
                    str(directory),
                    str(REPO / "events" / event),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith('{"response"')]
            if done.returncode != 0 or not lines:
                print(f"FAIL {function} {event}: exit {done.returncode}\n{done.stderr[-3000:]}")
                failures += 1
                continue
            result = json.loads(lines[-1])
            response = result["response"]
            if response.get("isBase64Encoded"):
                response["body"] = base64.b64decode(response["body"]).decode(errors="replace")
            ok = good(response)
            failures += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} {function} {event}: python {result['python']}, fnserve and "
                f"onnxruntime from {', '.join(result['loaded_from'])}: {json.dumps(response)[:160]}"
            )
    print("\nunzipped sizes (Lambda's limit for a function and its layers together: 250 MB)")
    for name, n in sizes.items():
        print(f"  {name:<17}{n / 2**20:8.1f} MB")
    for function in dict.fromkeys(function for function, _, _ in CHECKS):
        total = sizes["FnserveLayer"] + sizes["ModelsLayer"] + sizes[function]
        verdict = "ok" if total < LAMBDA_LIMIT else "OVER THE LIMIT"
        failures += total >= LAMBDA_LIMIT
        print(f"  {function} with its layers: {total / 2**20:.1f} MB ({verdict})")
    if sizes["FnserveLayer"] > LAYER_TARGET:
        print(f"  note: the runtime layer is over the {LAYER_TARGET / 2**20:.0f} MB target")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else REPO / ".aws-sam" / "build"))
