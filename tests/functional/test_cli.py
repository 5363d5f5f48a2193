"""The fnserve command line, run in-process on the demo models."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as tpb
from tritonclient.grpc import service_pb2_grpc as tpb_grpc
from typer.testing import CliRunner

from fnserve import quantize as q
from fnserve.cli import app
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, REPO
from tests.moto import free_port
from tests.servers import start_http

MODELS_DIR = DEMO_MANIFEST.parent
ACCURATE = MODELS_DIR / "digits-accurate" / "1" / "model.onnx"
runner = CliRunner()


def test_predict_prints_predictions_beside_true_labels() -> None:
    result = runner.invoke(app, ["predict", "digits-fast", str(DEMO_HOLDOUT), "-m", str(DEMO_MANIFEST), "-n", "8"])
    assert result.exit_code == 0, result.output
    labels = np.load(DEMO_HOLDOUT)["labels"][:8]
    rows = [line for line in result.output.splitlines() if line.strip().startswith("row")]
    assert len(rows) == 8
    for line, label in zip(rows, labels, strict=True):
        assert f"true {label}" in line
    assert "accuracy" in result.output


def test_predict_reports_a_clear_error_for_unknown_models() -> None:
    result = runner.invoke(app, ["predict", "nope", str(DEMO_HOLDOUT), "-m", str(DEMO_MANIFEST)])
    assert result.exit_code == 1
    assert "Request for unknown model: 'nope' is not found" in result.output


def test_models_lists_inputs_and_outputs() -> None:
    result = runner.invoke(app, ["models", "-m", str(DEMO_MANIFEST)])
    assert result.exit_code == 0, result.output
    assert "digits-accurate-int8" in result.output
    assert "probabilities" in result.output and "[-1, 10]" in result.output


def test_models_lists_the_cascades_too() -> None:
    result = runner.invoke(app, ["models", "-m", str(DEMO_MANIFEST)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("digits "))
    assert "cascade: digits-fast at once, digits-accurate follows up unless top1 of 'probabilities'" in line
    assert ">= 0.65" in line


def test_predict_a_cascade_answers_each_row_as_its_follow_up_would() -> None:
    import onnxruntime as ort

    n = 300
    result = runner.invoke(app, ["predict", "digits", str(DEMO_HOLDOUT), "-m", str(DEMO_MANIFEST), "-n", str(n)])
    assert result.exit_code == 0, result.output
    x = np.load(DEMO_HOLDOUT)["input"][:n]
    fast = ort.InferenceSession(str(MODELS_DIR / "digits-fast" / "1" / "model.onnx"))
    fast_label, fast_p = fast.run(None, {"input": x})
    slow_label, _ = ort.InferenceSession(str(ACCURATE)).run(None, {"input": x})
    unsure = fast_p.max(axis=1) < 0.65
    expected = np.where(unsure, slow_label, fast_label)
    assert f"digits-fast answered {int((~unsure).sum())} rows, digits-accurate followed up on {int(unsure.sum())}" in (
        result.output
    )
    rows = [line for line in result.output.splitlines() if line.strip().startswith("row")]
    assert [int(line.split("predicted")[1].split()[0]) for line in rows] == expected.tolist()
    assert 0 < unsure.sum() < n


def test_quantize_dynamic_reports_size_latency_and_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # nothing may be left in the working directory
    out = tmp_path / "q.onnx"
    args = [
        "quantize",
        str(ACCURATE),
        "-o",
        str(out),
        "--validation",
        str(DEMO_HOLDOUT),
        "--rounds",
        "20",
        "--force",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "size              200.6 KiB ->" in result.output
    assert "latency batch 1 " in result.output and "latency batch 64" in result.output
    assert "accuracy          0.9750 ->" in result.output
    assert "top-1 agreement" in result.output
    assert out.stat().st_size < ACCURATE.stat().st_size / 2
    assert not list(workdir.iterdir())


def test_quantize_static_needs_calibration(tmp_path: Path) -> None:
    result = runner.invoke(app, ["quantize", str(ACCURATE), "-o", str(tmp_path / "q.onnx"), "--mode", "static"])
    assert result.exit_code == 1
    assert "static quantization needs --calibration" in result.output


def test_quantize_static_with_calibration(tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    calib = MODELS_DIR / "digits-calibration.npz"
    args = ["quantize", str(ACCURATE), "-o", str(out), "--mode", "static", "--per-channel"]
    args += ["--calibration", str(calib), "--validation", str(DEMO_HOLDOUT), "--rounds", "10", "--force"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "mode              static per-channel" in result.output
    assert out.exists()


def test_quantize_refuses_to_write_a_slower_model_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slower(*args: object, **kwargs: object) -> q.Latency:
        return q.Latency(int(args[3]), before_ms=1.0, after_ms=1.5)  # type: ignore[call-overload]

    monkeypatch.setattr(q, "measure_latency", slower)
    out = tmp_path / "q.onnx"
    result = runner.invoke(app, ["quantize", str(ACCURATE), "-o", str(out)])
    assert result.exit_code == 1
    assert "confidently slower at batch 1, 64 (see above); not writing" in result.output
    assert not out.exists()
    result = runner.invoke(app, ["quantize", str(ACCURATE), "-o", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert f"sha256 {hashlib.sha256(out.read_bytes()).hexdigest()}" in result.output


def test_slower_means_confidently_slower_by_more_than_the_smallest_effect() -> None:
    rng = np.random.default_rng(1)
    noise = lambda: 1e-3 * (1 + 0.05 * rng.standard_normal(200))  # noqa: E731 - 5% jitter per run
    before = noise()
    cases = {
        "same speed, noisy": noise(),
        "5% slower": noise() * 1.05,
        "1% slower": noise() * 1.01,
        "10% faster": noise() * 0.9,
    }
    verdicts = {}
    for name, after in cases.items():
        ratio, low, high = q.paired_ratio_interval(list(before), list(after))
        assert low <= ratio <= high
        verdicts[name] = q.Latency(1, 1.0, ratio, ratio, low, high, 200)
    assert [name for name, lat in verdicts.items() if lat.slower] == ["5% slower"]
    assert verdicts["10% faster"].verdict().startswith("faster (after/before 0.9")
    assert "95% CI" in verdicts["same speed, noisy"].verdict()
    assert "over 200 paired rounds" in verdicts["1% slower"].verdict()
    # Without an interval (the medians only), beyond 2% is slower.
    report = q.QuantizeReport("dynamic", 2, 1)
    report.latencies = [q.Latency(1, 1.0, 1.01), q.Latency(64, 1.0, 1.2)]
    assert report.slower_at() == [64]


def test_cascade_tune_recommends_a_threshold_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "tune.png"
    args = ["cascade", "tune", "digits", "--data", str(DEMO_HOLDOUT), "-m", str(DEMO_MANIFEST)]
    result = runner.invoke(app, [*args, "--target-accuracy", "0.977", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "digits-fast alone 0.9556, digits-accurate alone 0.9750" in result.output
    assert "| 0.65 | 88.3% | 0.9778 **recommended** |" in result.output
    assert "recommended threshold 0.65" in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    impossible = runner.invoke(app, [*args, "--target-accuracy", "0.999"])
    assert "no threshold reaches accuracy 0.999" in impossible.output
    assert (
        runner.invoke(app, ["cascade", "tune", "nope", "--data", str(DEMO_HOLDOUT), "-m", str(DEMO_MANIFEST)]).exit_code
        == 1
    )


def test_the_manifest_defaults_to_fnserve_manifest_then_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FNSERVE_MANIFEST", raising=False)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 1 and "manifest.toml does not exist" in result.output
    monkeypatch.setenv("FNSERVE_MANIFEST", str(DEMO_MANIFEST))
    assert "digits-accurate" in runner.invoke(app, ["models"]).output
    monkeypatch.delenv("FNSERVE_MANIFEST")
    monkeypatch.chdir(DEMO_MANIFEST.parent)
    result = runner.invoke(app, ["cascade", "tune", "digits", "--data", str(DEMO_HOLDOUT)])
    assert result.exit_code == 0 and "cascade digits" in result.output, result.output


def test_serve_on_a_port_another_program_holds_stops_at_once(tmp_path: Path) -> None:
    """Before any model loads, and without sharing the port (SO_REUSEPORT) with whatever holds it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [str(Path(sys.executable).parent / "fnserve"), "serve", "-m", str(DEMO_MANIFEST), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode != 0 and f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in done.stderr
    assert "loaded model" not in done.stderr


def test_a_second_server_on_either_port_of_the_first_stops_at_once_and_the_first_keeps_every_request(
    tmp_path: Path,
) -> None:
    """gRPC sets SO_REUSEPORT by default: a second server used to join the first one's gRPC port and split its
    calls, each answering for its own models."""
    fnserve = str(Path(sys.executable).parent / "fnserve")
    http, grpc_port, other = free_port(), free_port(), free_port()
    first = [fnserve, "serve", "-m", str(DEMO_MANIFEST), "--port", str(http), "--grpc-port", str(grpc_port)]
    proc, url = start_http(first, http, tmp_path / "first.log")
    try:
        for second in (
            [fnserve, "serve", "-m", str(DEMO_MANIFEST), "--port", str(http)],
            [fnserve, "serve", "-m", str(DEMO_MANIFEST), "--port", str(other), "--grpc-port", str(grpc_port)],
        ):
            done = subprocess.run(second, capture_output=True, text=True, timeout=60, cwd=tmp_path)
            assert done.returncode != 0 and "loaded model" not in done.stderr, done.stderr
            taken = http if "--grpc-port" not in second else grpc_port
            assert f"port {taken} on 127.0.0.1 is in use by pid " in done.stderr, done.stderr
        body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
        answers = [httpx.post(f"{url}/v2/models/digits-fast/infer", json=body).status_code for _ in range(20)]
        assert answers == [200] * 20
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = tpb_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(20):  # each call a new connection would be hashed over the group, were there one
                assert stub.ServerReady(tpb.ServerReadyRequest(), timeout=10).ready
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_emulator_on_a_taken_port_stops_before_it_starts_anything(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [str(Path(sys.executable).parent / "fnserve"), "local", "--template", str(REPO / "template.yaml")]
            + ["--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode != 0, done.stdout
    assert f"the gateway's port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in done.stderr, done.stderr
    assert "moto" not in done.stdout + done.stderr  # nothing started: not the AWS emulator, not a function


BROKEN_FUNCTION = """Transform: AWS::Serverless-2016-10-31
Resources:
  Broken:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: broken
      Handler: app.handler
      Runtime: python3.12
      Events:
        Get:
          Type: HttpApi
          Properties:
            Path: /broken
            Method: GET
"""


def test_the_emulator_stops_with_a_functions_init_error_when_it_cannot_start(tmp_path: Path) -> None:
    (tmp_path / "template.yaml").write_text(BROKEN_FUNCTION)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "app.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", "LOCALSTACK_HOST")}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "fnserve"), "local", "--template", "template.yaml"]
        + ["--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "error: function Broken cannot start: app.handler failed to initialise: "
        "ModuleNotFoundError: No module named 'torch'"
    ), done.stderr


# -- the first hour's rough edges ---------------------------------------------------------------


def test_quantize_a_scikit_learn_linear_model_says_there_is_nothing_to_quantize(tmp_path: Path) -> None:
    """skl2onnx lists the default opset twice, which onnxruntime's quantizer refused outright."""
    fast = MODELS_DIR / "digits-fast" / "1" / "model.onnx"
    result = runner.invoke(app, ["quantize", str(fast), "-o", str(tmp_path / "q.onnx"), "--rounds", "10", "--force"])
    assert result.exit_code == 0, result.output
    assert "nothing quantized: none of this graph's operators (LinearClassifier" in result.output
    assert "WARNING:root" not in result.output  # onnxruntime's own advice on the root logger is not shown


def test_models_push_help_shows_its_destinations() -> None:
    result = runner.invoke(app, ["models", "push", "--help"])
    assert result.exit_code == 0, result.output  # was a rich MarkupError on "[/prefix]"
    assert "s3://bucket/prefix" in result.output


def test_serving_a_model_file_instead_of_a_manifest_says_how_to_write_one(tmp_path: Path) -> None:
    result = runner.invoke(app, ["serve", "-m", str(ACCURATE), "--port", "0"])
    assert result.exit_code == 1
    assert "is not a manifest" in result.output and "fnserve manifest add" in result.output
    copy = tmp_path / "model.bin"  # whatever its name, a binary file is not a manifest
    copy.write_bytes(ACCURATE.read_bytes())
    assert "fnserve manifest add" in runner.invoke(app, ["serve", "-m", str(copy), "--port", "0"]).output


def test_results_of_bytes_outputs_are_written_as_text_to_jsonl(tmp_path: Path) -> None:
    from fnserve.stores.job_client import Results, write_results

    labels = np.array([b"seven", b"\xff"], dtype=object)  # a pipeline's label names; the second is no UTF-8
    results = Results(done={"j1": {"labels": labels, "scores": np.array([0.9, 0.1], np.float32)}}, failed={"j2": "x"})
    out = tmp_path / "out.jsonl"
    write_results(results, ["j1", "j2", "j3"], out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["outputs"]["labels"] == ["seven", "\\xff"]
    assert [line["status"] for line in lines] == ["done", "failed", "pending"]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no partial file left beside it


def test_serve_listens_on_the_port_a_platform_gives_in_PORT_after_its_own_settings(tmp_path: Path) -> None:
    """Cloud Run and Knative give a container its port in PORT; --port, then FNSERVE_PORT, come first."""
    base = {k: v for k, v in os.environ.items() if k not in ("PORT", "FNSERVE_PORT", "FNSERVE_GRPC_PORT")}
    serve = [sys.executable, "-m", "fnserve", "serve", "-m", str(DEMO_MANIFEST), "--workers", "0", "--processes", "1"]
    platform, own, given = free_port(), free_port(), free_port()
    for env, cmd, listening in (
        ({"PORT": str(platform)}, serve, platform),
        ({"PORT": str(free_port()), "FNSERVE_PORT": str(own)}, serve, own),
        ({"PORT": str(free_port())}, [*serve, "--port", str(given)], given),
    ):
        proc, url = start_http(cmd, listening, tmp_path / "serve.log", env=base | env)
        try:
            assert httpx.get(f"{url}/v2/models/digits-accurate/ready", timeout=5).status_code == 200
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_serve_refuses_the_same_port_for_http_and_grpc() -> None:
    result = runner.invoke(app, ["serve", "-m", str(DEMO_MANIFEST), "--grpc-port", "8081"], env={"PORT": "8081"})
    assert result.exit_code == 1
    assert "HTTP and gRPC both asked for port 8081" in result.output


def test_the_port_never_closes_while_a_server_of_several_front_processes_starts(tmp_path: Path) -> None:
    """503 while the models load; then the front processes join the port (SO_REUSEPORT) before the server that
    answered leaves it: a client polling from the port's first answer to ready is never refused."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "fnserve"), "serve", "-m", str(DEMO_MANIFEST), "--port", str(port)]
    with (tmp_path / "serve.log").open("wb") as log:
        proc = subprocess.Popen([*command, "--processes", "2", "--workers", "0"], stdout=log, stderr=log)
    statuses: list[int | str] = []
    try:
        while 200 not in statuses:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                statuses.append(httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code)
            except httpx.ConnectError:
                if statuses:  # refused after the port first answered
                    statuses.append("refused")
                else:  # not open yet: poll, without taking the CPU the start needs
                    time.sleep(0.01)
            except httpx.TransportError as exc:  # a connection reset as the starting server leaves
                statuses.append(type(exc).__name__)
            assert len(statuses) < 20_000, statuses[-20:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert 503 in statuses and "refused" not in statuses, statuses


def test_serve_stops_at_start_on_a_pipeline_it_cannot_build(tmp_path: Path) -> None:
    """A missing tokenizer stops fnserve serve as a missing model file does: no server left never ready."""
    import shutil

    shutil.copytree(MODELS_DIR, tmp_path / "models")
    (tmp_path / "models" / "minilm-l6" / "tokenizer.json").unlink()
    command = [sys.executable, "-m", "fnserve", "serve", "-m", str(tmp_path / "models" / "manifest.toml")]
    done = subprocess.run([*command, "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "error: pipeline 'minilm-embed' cannot be built: tokenizer" in done.stderr
    assert "minilm-l6/tokenizer.json does not exist" in done.stderr
