"""The CPU server image against SageMaker Serverless Inference's container contract (``Mode=serverless`` of
``infra/container/sagemaker.yaml``).

Started as SageMaker starts it, ``docker run IMAGE serve``: the image's entrypoint with ``serve``, the environment
the template's ``Mode=serverless`` gives it (the fast start), its user, the demo models at /opt/ml/model (baked
in), port 8080 moved to a free one as ``docker run -p`` would map it. Checked:
``/ping`` answers within 2 s of the port opening, 503 while the models load, and 200 within the 3 minutes
serverless gives a container to start; the server's processes, the demo manifest loaded and warm, fit the
template's default memory size (read from /proc: buildah's chroot isolation shares the host's process
namespace); nothing of CUDA in the image or in the server, since serverless has no GPUs.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from cfnlint.decode.cfn_yaml import load
from PIL import Image

from fnserve.bench.sweep import process_tree
from tests.helpers import DEMO_HOLDOUT, REPO, demo_labels
from tests.image.buildah import Built, Running, started
from tests.moto import free_port

PING_WITHIN_S = 2.0  # SageMaker's health check gives /ping this long to answer
START_WITHIN_S = 180.0  # serverless: the model downloaded and /ping answering 200 within 3 minutes
MEMORY_SIZES_MB = (1024, 2048, 3072)  # the sizes compared; the template's default is asserted
TEMPLATE = load(str(REPO / "infra" / "container" / "sagemaker.yaml"))
DEFAULT_MEMORY_MB: int = TEMPLATE["Parameters"]["ServerlessMemorySizeInMB"]["Default"]
# What the template's Mode=serverless adds to the container's environment (the fast start).
SERVERLESS_ENV = {
    key: value["Fn::If"][1]
    for key, value in TEMPLATE["Resources"]["Model"]["Properties"]["PrimaryContainer"]["Environment"].items()
    if isinstance(value, dict) and value.get("Fn::If", [None])[0] == "IsServerless"
}
DIGITS = ("digits-fast", "digits-accurate", "digits-accurate-int8")
ROWS = np.load(DEMO_HOLDOUT)["input"][:64]
CUDA_LIBRARIES = ("libcuda", "libcudart", "libcudnn", "libcublas", "libcufft", "libcurand", "libnvinfer", "libnvidia")


@dataclass
class Ping:
    at: float  # seconds after the port opened that it was sent
    took: float
    answer: int | str  # the status code, or "refused", "timed out", the error of a connection closed unanswered


@dataclass
class Start:
    running: Running
    url: str
    opened_after: float  # seconds from the container's process starting to its port accepting connections
    pings: list[Ping] = field(default_factory=list)
    ready_after: float | None = None  # seconds from the process starting to /ping's first 200


def _ping(client: httpx.Client, url: str, opened: float) -> Ping:
    sent = time.monotonic()
    try:
        answer: int | str = client.get(f"{url}/ping").status_code
    except httpx.TimeoutException:
        answer = "timed out"
    except httpx.ConnectError:
        answer = "refused"
    except httpx.TransportError as exc:  # a connection closed without an answer
        answer = type(exc).__name__
    return Ping(sent - opened, time.monotonic() - sent, answer)


@pytest.fixture(scope="module")
def serverless(server_image: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Start]:
    """The image started as SageMaker starts it, its port watched from the first moment and /ping polled until it
    answers 200 (or the start budget is spent); yields the record, the server still running."""
    port, grpc = free_port(), free_port()
    command = [*server_image.config["Entrypoint"], "serve"]  # SageMaker's argument, in place of the image's CMD
    env = {"FNSERVE_PORT": str(port), "FNSERVE_GRPC_PORT": str(grpc), **SERVERLESS_ENV}
    log = tmp_path_factory.mktemp("serverless") / "serve.log"
    with started(server_image.name, command, log, env) as running:
        began = time.monotonic()
        while True:
            assert running.process.poll() is None, running.output()
            assert time.monotonic() - began < START_WITHIN_S, "the port never opened\n" + running.output()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.01)
        opened = time.monotonic()
        start = Start(running, f"http://127.0.0.1:{port}", opened - began)
        with httpx.Client(timeout=PING_WITHIN_S) as client:
            while time.monotonic() - began < START_WITHIN_S and running.process.poll() is None:
                start.pings.append(_ping(client, start.url, opened))
                if start.pings[-1].answer == 200:
                    start.ready_after = time.monotonic() - began
                    break
                time.sleep(0.05)
        yield start


def test_ping_answers_within_2s_of_the_port_opening_and_200_once_loaded(
    serverless: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    pings = serverless.pings
    first = pings[0]
    answered = [p for p in pings if isinstance(p.answer, int)]
    slowest = max(answered, key=lambda p: p.took, default=first)
    unanswered = [p for p in pings if not isinstance(p.answer, int)]
    kinds = ", ".join(
        f"{sum(p.answer == kind for p in unanswered)} {kind}" for kind in dict.fromkeys(p.answer for p in unanswered)
    )
    ready = "never" if serverless.ready_after is None else f"{serverless.ready_after:.1f} s after the process started"
    with capsys.disabled():
        print(
            f"\nserverless start: port open {serverless.opened_after:.2f} s after the process started; first /ping "
            f"{first.answer} in {first.took * 1000:.0f} ms; slowest answer {slowest.took * 1000:.0f} ms "
            f"({slowest.answer}); {len(pings)} pings"
            + (
                f", unanswered: {kinds}, {unanswered[0].at:.2f} s to {unanswered[-1].at:.2f} s after the port opened"
                if unanswered
                else ""
            )
            + f"; 200 {ready}"
        )
    assert isinstance(first.answer, int) and first.at + first.took <= PING_WITHIN_S, first
    assert not [p for p in pings if p.answer == "timed out" or p.took > PING_WITHIN_S], pings
    assert serverless.ready_after is not None, serverless.running.output()
    assert {p.answer for p in answered} <= {503, 200}, pings
    # Once open, the port stays open: the front processes join it before the server answering 503 leaves.
    assert not [p for p in pings if p.answer == "refused"], pings


def _warm(url: str) -> None:
    """A request to every model and pipeline of the demo manifest, at its largest shapes."""
    buffer = io.BytesIO()
    np.save(buffer, ROWS)
    for name in DIGITS:
        answer = httpx.post(
            f"{url}/invocations",
            content=buffer.getvalue(),
            headers={"content-type": "application/x-npy", "x-amzn-sagemaker-target-model": name},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        label = next(output for output in answer.json()["outputs"] if output["name"] == "label")
        assert label["data"] == demo_labels(name, ROWS)
    client = triton_http.InferenceServerClient(url.removeprefix("http://"), network_timeout=60)
    texts = np.array(["Serverless inference on the CPU image. " * 40] * 8, dtype=object)  # 256 tokens, truncated
    pixels = Image.fromarray(np.round(ROWS[0].reshape(8, 8) * 255 / 16).astype(np.uint8), "L").resize((64, 64))
    png = io.BytesIO()
    pixels.save(png, "PNG")
    for pipeline, name, data, output, shape in (
        ("minilm-embed", "text", texts, "embedding", [8, 384]),
        ("digits-image", "image", np.array([png.getvalue()] * 4, dtype=object), "label", [4]),
    ):
        tensor = triton_http.InferInput(name, list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data, binary_data=True)
        assert list(client.infer(pipeline, [tensor]).as_numpy(output).shape) == shape
    client.close()


def _kb(text: str, key: str) -> int:
    return int(next(line for line in text.splitlines() if line.startswith(key)).split()[1])


def _server(running: Running) -> int:
    """The pid of the container's ``fnserve serve`` Python process: not buildah's chroot helper above it, whose
    command line names ``fnserve`` too and which is no part of the container SageMaker would run."""
    for pid in process_tree(running.process.pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if len(argv) > 1 and Path(argv[0].decode()).name.startswith("python") and argv[1].endswith(b"/fnserve"):
                return pid
    raise AssertionError("no fnserve process in the container")


def _role(pid: int, server: int) -> str:
    if pid == server:
        return "server"
    command = Path(f"/proc/{pid}/cmdline").read_bytes()
    return "resource tracker" if b"resource_tracker" in command else "child" if b"spawn_main" in command else "other"


def _layout(output: str) -> str:
    """What the server's start log says of the layout it chose (processes and workers, and why)."""
    for line in output.splitlines():
        if "serving layout" in line:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                return str(json.loads(line[line.index("{") :])["message"])
            return line.strip()
    return "no layout line (a layout was set)"


def _every_front_loaded(running: Running) -> None:
    """Wait until every front process has loaded the manifest (a fast start is ready with the first alone): the
    memory of the ones still starting would not be counted."""
    laid_out = re.search(r"serving layout: (\d+) front process", running.output())
    fronts = int(laid_out[1]) if laid_out else 1
    began = time.monotonic()
    while any(running.output().count(f"loaded model '{name}'") < fronts for name in (*DIGITS, "minilm-l6")):
        assert time.monotonic() - began < START_WITHIN_S, running.output()
        time.sleep(0.05)


def test_the_warm_server_fits_the_default_memory_size(serverless: Start, capsys: pytest.CaptureFixture[str]) -> None:
    """Resident memory of every process of the server (front processes, inference workers), the demo manifest
    loaded and each of its models and pipelines run: their peaks (VmHWM, loading included) summed, a bound on the
    container's use, must fit under the template's default ServerlessMemorySizeInMB."""
    assert serverless.ready_after is not None, serverless.running.output()
    _every_front_loaded(serverless.running)
    _warm(serverless.url)
    server = _server(serverless.running)
    rows: list[tuple[str, int, int, int]] = []  # role, RSS, PSS, peak RSS (kB)
    for pid in process_tree(server):
        with contextlib.suppress(OSError, StopIteration):  # a process gone since the tree was read
            status = Path(f"/proc/{pid}/status").read_text()
            pss = _kb(Path(f"/proc/{pid}/smaps_rollup").read_text(), "Pss:")
            rows.append((_role(pid, server), _kb(status, "VmRSS:"), pss, _kb(status, "VmHWM:")))
    rss_mb = sum(row[1] for row in rows) / 1024
    pss_mb = sum(row[2] for row in rows) / 1024
    peak_mb = sum(row[3] for row in rows) / 1024
    each = ", ".join(f"{role} {rss / 1024:.0f}/{peak / 1024:.0f}" for role, rss, _, peak in rows)
    fits = "; ".join(
        f"{size} MB: {'fits' if peak_mb < size else 'too small'} ({size - peak_mb:+.0f} MB)" for size in MEMORY_SIZES_MB
    )
    with capsys.disabled():
        print(
            f"\nserverless memory, demo manifest warm, {len(rows)} processes: RSS {rss_mb:.0f} MB, PSS {pss_mb:.0f} MB,"
            f" peak RSS {peak_mb:.0f} MB (each, RSS/peak MB: {each}). Against the peak: {fits}."
            f"\n{_layout(serverless.running.output())}"
        )
    assert peak_mb < DEFAULT_MEMORY_MB, f"the warm server's peak {peak_mb:.0f} MB does not fit {DEFAULT_MEMORY_MB} MB"


def test_nothing_of_cuda_in_the_running_server(serverless: Start) -> None:
    assert serverless.ready_after is not None, serverless.running.output()
    for pid in process_tree(_server(serverless.running)):
        with contextlib.suppress(OSError):
            mapped = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/" in line}
            assert not {path for path in mapped if Path(path).name.startswith(CUDA_LIBRARIES)}, pid
    for name in DIGITS:
        ready = httpx.get(f"{serverless.url}/v2/models/{name}/ready", timeout=10).json()
        assert (ready["providers"], ready["device"]) == (["CPUExecutionProvider"], "cpu"), ready


INSPECT = """
import importlib.metadata as m, json, os, onnxruntime as ort
names = ({cuda!r})
libs = [os.path.join(d, f) for root in ("/opt/fnserve", "/usr/lib", "/usr/local/lib", "/lib")
        for d, _, files in os.walk(root) for f in files if f.startswith(names)]
print(json.dumps({{"providers": ort.get_available_providers(), "libs": libs,
                  "dists": sorted(d.metadata["Name"].lower() for d in m.distributions())}}))
"""


def test_the_cpu_image_holds_no_cuda_libraries(server_image: Built, tmp_path: Path) -> None:
    """No GPU assumed: no CUDA library anywhere in the image, no GPU package, and onnxruntime's CPU providers."""
    assert not [v for v in server_image.config.get("Env") or [] if v.startswith("NVIDIA_")]
    script = INSPECT.format(cuda=CUDA_LIBRARIES)
    with started(server_image.name, ["python", "-c", script], tmp_path / "inspect.log") as running:
        assert running.process.wait(120) == 0, running.output()
    found = json.loads(running.output().strip().splitlines()[-1])
    assert found["libs"] == []
    assert not [d for d in found["dists"] if d == "onnxruntime-gpu" or d.startswith(("nvidia-", "tensorrt"))]
    assert "CPUExecutionProvider" in found["providers"]
    assert not [p for p in found["providers"] if p.startswith(("CUDA", "Tensorrt", "ROCM", "MIGraphX"))]
