"""The server image (``infra/container/Dockerfile``, CPU variant), built by buildah and started from the image.

Started as a container runtime starts it: the image's ENTRYPOINT and CMD, its user, its environment
and working directory, its baked-in models. The container shares the host's network (buildah's chroot
isolation has no network namespace), so each test moves the ports to free ones with FNSERVE_PORT (or PORT, as
Cloud Run and Knative give it) and FNSERVE_GRPC_PORT, as ``docker run -p`` would map them, and the HEALTHCHECK is
run in that environment.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from fnserve.bench.sweep import process_tree
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO, demo_labels
from tests.helpers.images import ping, serving
from tests.image.buildah import Built, Running, started, unlocked
from tests.moto import free_port
from tests.servers import wait_for

HOLDOUT = np.load(DEMO_HOLDOUT)


def server_pid(running: Running) -> int:
    """The host's pid of the container's ``fnserve`` process (the first below buildah's, its children after it)."""
    for pid in process_tree(running.process.pid):
        with contextlib.suppress(OSError):
            if any(part.endswith(b"/fnserve") for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]):
                return pid
    raise AssertionError("no fnserve process in the container")


def uid(pid: int) -> int:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    return int(line.split()[1])


def test_the_image_serves_sagemaker_v2_and_grpc_as_its_non_root_user(server_image: Built, tmp_path: Path) -> None:
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
    with serving(server_image, tmp_path / "serve.log", env) as (running, url, grpc):
        wait_for(lambda: ping(running, url) == 200, 180, "the image's server to answer /ping with 200")
        port = url.rsplit(":", 1)[1]
        pid = server_pid(running)
        assert server_image.config["User"] == "10001" and uid(pid) == 10001

        health = server_image.config["Healthcheck"]["Test"]
        assert health[0] == "CMD", health
        done = running.exec(["env", f"FNSERVE_PORT={port}", *health[1:]])  # the container's environment
        assert done.returncode == 0, done.stderr

        # SAGEMAKER_MODEL_SERVER_WORKERS: two inference workers, children of the server, hold the models.
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        idle_or_busy = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("fnserve_inference_workers{")
        ]
        assert sum(idle_or_busy) == 2, metrics
        assert "2 inference worker(s)" in running.output()

        rows = HOLDOUT["input"][:5]
        buffer = io.BytesIO()
        np.save(buffer, rows)
        answer = httpx.post(
            f"{url}/invocations",
            content=buffer.getvalue(),
            headers={"content-type": "application/x-npy", "x-amzn-sagemaker-target-model": "digits-accurate"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        label = next(output for output in answer.json()["outputs"] if output["name"] == "label")
        assert label["data"] == demo_labels("digits-accurate", rows)

        for client_module, address in ((triton_http, url.removeprefix("http://")), (triton_grpc, grpc)):
            client = client_module.InferenceServerClient(address)
            assert client.is_server_ready() and client.is_model_ready("digits-fast")
            tensor = client_module.InferInput("input", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            result = client.infer("digits-fast", [tensor])
            assert result.as_numpy("label").tolist() == demo_labels("digits-fast", rows)
            client.close()

        bad = httpx.post(f"{url}/v2/models/digits-fast/infer", content=b"{not json", timeout=10)
        assert bad.status_code == 400 and "error" in bad.json()


def test_ping_answers_503_until_the_models_are_loaded(server_image: Built, tmp_path: Path) -> None:
    """Models mounted at /opt/ml/model (as SageMaker unpacks them), the model behind a FIFO the test writes
    once it has seen the 503: the load waits on the test, not on timing."""
    models = tmp_path / "model"
    models.mkdir()
    data = (DEMO_MANIFEST.parent / "digits-fast" / "1" / "model.onnx").read_bytes()
    manifest = DEMO_MANIFEST.read_text()
    start = manifest.index("[[models]]")
    entry = manifest[start : manifest.index("[[models]]", start + 1)]
    (models / "manifest.toml").write_text(entry.replace("digits-fast/1/model.onnx", "gate.onnx"))
    gate = models / "gate.onnx"
    os.mkfifo(gate, 0o666)
    models.chmod(0o755)
    one_process = {"FNSERVE_SERVER_PROCESSES": "1", "FNSERVE_PARALLEL_WORKERS": "0"}  # the gate is read once
    volumes = {models: "/opt/ml/model"}
    with serving(server_image, tmp_path / "serve.log", one_process, volumes) as (running, url, _):
        wait_for(lambda: ping(running, url) is not None, 120, "the image's server to answer /ping at all")
        assert ping(running, url) == 503
        refused = httpx.get(f"{url}/v2/health/ready", timeout=2)
        assert refused.status_code == 503 and refused.headers["retry-after"] and refused.json()["error"]
        with gate.open("wb") as out:  # opens once the server is reading it: the load is waiting on the test
            out.write(data)
        wait_for(lambda: ping(running, url) == 200, 120, "/ping to answer 200 once the model is loaded")
        assert httpx.get(f"{url}/v2/models/digits-fast/ready", timeout=5).status_code == 200


def test_an_image_without_its_manifest_stops_with_the_reason(server_image: Built, tmp_path: Path) -> None:
    env = {"FNSERVE_MANIFEST": "/opt/ml/model/missing.toml"}
    with serving(server_image, tmp_path / "serve.log", env) as (running, _, _):
        running.process.wait(120)
        assert running.process.returncode != 0
        assert "/opt/ml/model/missing.toml" in running.output()


def test_the_image_holds_the_locked_versions(server_image: Built, tmp_path: Path) -> None:
    lock = REPO / "infra" / "container" / "requirements.lock"
    assert unlocked(server_image, "python", lock, tmp_path / "installed.log") == {}


def test_the_image_listens_on_the_port_a_platform_gives_in_PORT(server_image: Built, tmp_path: Path) -> None:
    """Cloud Run and Knative set PORT: the image sets no port of its own that would override it."""
    port, grpc = free_port(), free_port()
    command = server_image.config["Entrypoint"] + server_image.config["Cmd"]
    env = {"PORT": str(port), "FNSERVE_GRPC_PORT": str(grpc)}
    with started(server_image.name, command, tmp_path / "serve.log", env) as running:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: ping(running, url) == 200, 180, "the image's server to answer /ping on PORT")
        health = server_image.config["Healthcheck"]["Test"]
        done = running.exec(["env", f"PORT={port}", *health[1:]])
        assert done.returncode == 0, done.stderr
