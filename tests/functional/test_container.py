"""The container image's entrypoint, run here as the image runs it: its ENV, ENTRYPOINT and CMD, and its HEALTHCHECK.

Docker cannot build here; what the image runs can: ``fnserve serve`` from a virtualenv built from the same
pyproject, with the Dockerfile's own environment (models at /opt/ml/model moved to a temporary folder,
ports moved to free ones, as a platform's PORT or docker run -p would), answering SageMaker's /ping and
/invocations and gRPC beside HTTP.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as triton

from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, dockerfile_instructions
from tests.moto import free_port
from tests.servers import wait_for


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in dockerfile_instructions("ENV"):
        env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


def test_the_image_entrypoint_serves_sagemaker_and_v2_and_grpc(tmp_path: Path) -> None:
    command = json.loads(dockerfile_instructions("ENTRYPOINT")[0]) + json.loads(dockerfile_instructions("CMD")[-1])
    assert command == ["fnserve", "serve"]  # SageMaker runs the image with the argument "serve"
    env = image_env()
    # No port of its own in ENV, so that a platform's PORT holds (Cloud Run, Knative); the CLI's default is 8080.
    assert "FNSERVE_PORT" not in env and "PORT" not in env and env["FNSERVE_HOST"] == "0.0.0.0"
    assert env["FNSERVE_MANIFEST"] == "/opt/ml/model/manifest.toml"
    model_dir = tmp_path / "opt-ml-model"  # what SageMaker unpacks at /opt/ml/model
    shutil.copytree(DEMO_MANIFEST.parent, model_dir)
    http, grpc = free_port(), free_port()
    env |= {
        "FNSERVE_MANIFEST": str(model_dir / "manifest.toml"),
        "FNSERVE_PORT": str(http),
        "FNSERVE_GRPC_PORT": str(grpc),
        "FNSERVE_MODEL_CACHE_DIR": str(tmp_path / "cache"),
        "FNSERVE_DEFAULT_MODEL": "digits-accurate",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{http}/ping", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, 90, "the image's server to answer /ping")
        health = json.loads(dockerfile_instructions("HEALTHCHECK")[0].split("CMD", 1)[1])
        assert subprocess.run(health, env={**os.environ, **env}, capture_output=True).returncode == 0

        digits = np.load(DEMO_HOLDOUT)["input"][:3]
        buffer = io.BytesIO()
        np.save(buffer, digits)
        answer = httpx.post(
            f"http://127.0.0.1:{http}/invocations",
            content=buffer.getvalue(),
            headers={"content-type": "application/x-npy"},
            timeout=30,
        )
        assert answer.status_code == 200 and answer.json()["model_name"] == "digits-accurate", answer.text
        assert httpx.get(f"http://127.0.0.1:{http}/v2/models/digits-fast/ready").json()["device"] == "cpu"
        client = triton.InferenceServerClient(f"127.0.0.1:{grpc}")
        assert client.is_server_ready() and client.is_model_ready("digits-accurate")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
