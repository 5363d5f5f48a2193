"""Cold start of the API function with a ~100 MB model, in each way a Lambda function can carry it.

    python -m tests.bench.bench_lambda_image        (make image-test builds the image it needs)

A model of ~100 MB (an MLP whose 5,000 x 5,000 float32 layer is the bulk) does not fit the zip +
layers path beside fnserve's runtime layer (250 MB unzipped in all). Measured, fresh process to the
first answer of one API Gateway v2 inference event, median of BENCH_COLD_RUNS, interleaved:

- floor: a bare script that creates the model's onnxruntime session and runs it once;
- local file: the API function with the model on a local path, as a layer or a container image
  gives it (what the zip path would do, were the model small enough);
- ModelBucket: the manifest and the model on S3 (a moto server on loopback), downloaded to /tmp at the
  cold start, verified and loaded: the zip path's way around the limit;
- image: the Lambda image (infra/container/lambda.Dockerfile, built by buildah) started by
  ``buildah run`` and answering through fnserve's Runtime API, the model mounted at /opt/models. It
  includes buildah's own container start, which is not Lambda's: compare it with the other rows
  with that in mind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fnserve.emulator.images import image_exists
from tests.bench._timing import fresh_process_seconds
from tests.helpers import REPO
from tests.moto import aws_env, moto_server

COLD_RUNS = int(os.environ.get("BENCH_COLD_RUNS", "5"))
IMAGE = "localhost/fnserve-lambda:test"
HIDDEN = 5000


def big_model() -> onnx.ModelProto:
    """64 -> 5000 -> 5000 -> 10, ReLU between, a label (argmax) and the scores: ~102 MB of float32 weights."""
    rng = np.random.default_rng(0)
    shapes = {"w1": (64, HIDDEN), "w2": (HIDDEN, HIDDEN), "w3": (HIDDEN, 10)}
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape, np.float32) * 0.01, name) for name, shape in shapes.items()
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w3"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10]),
        ],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def write_models(directory: Path) -> Path:
    data = big_model().SerializeToString()
    (directory / "big" / "1").mkdir(parents=True)
    (directory / "big" / "1" / "model.onnx").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    manifest = directory / "manifest.toml"
    manifest.write_text(f'[[models]]\nname = "big"\npath = "big/1/model.onnx"\nsha256 = "{sha}"\n')
    return manifest


def event(path: Path) -> Path:
    sent = json.loads((REPO / "events" / "api-http-infer.json").read_text())
    sent["rawPath"] = sent["requestContext"]["http"]["path"] = "/v2/models/big/infer"
    path.write_text(json.dumps(sent))
    return path


FLOOR = """
import numpy as np, onnxruntime as ort
s = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
s.run(None, {"input": np.zeros((4, 64), np.float32)})
"""

API = f"""
import json, sys
sys.path.insert(0, {str(REPO / "functions" / "api")!r})
import app
from fnserve.aws.events import LambdaContext
answer = app.handler(json.load(open(EVENT)), LambdaContext(function_name="cold"))
assert answer["statusCode"] == 200, answer
"""


def image_seconds(models: Path, event_file: Path, moto_url: str) -> float:
    """From ``buildah run`` to the first answer through the Runtime API (the container is made before)."""
    from fnserve.emulator.images import LAMBDA_USER, Container
    from fnserve.emulator.runtime_api import RuntimeApi

    with RuntimeApi(timeout=300) as api:
        env = {**aws_env(moto_url), "AWS_LAMBDA_RUNTIME_API": api.address}
        command = ["/opt/fnserve/bin/python", "-m", "awslambdaric", "functions/api/app.handler"]
        container = Container(IMAGE, command, env, LAMBDA_USER, {str(models): "/opt/models"}).create()
        try:
            t0 = time.perf_counter()
            container.start()
            answer = api.invoke(json.loads(event_file.read_text()))
            seconds = time.perf_counter() - t0
            assert answer["statusCode"] == 200, answer
        finally:
            container.stop()
    return seconds


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="fnserve-bench-big-"))
    try:
        manifest = write_models(work / "models")
        model = work / "models" / "big" / "1" / "model.onnx"
        os.chmod(work, 0o755)
        event_file = event(work / "event.json")
        size_mb = model.stat().st_size / 1e6
        with moto_server(work / "moto.log") as url:
            os.environ.update(aws_env(url))
            from fnserve.aws import clients

            clients.reset()
            s3 = clients.client("s3")
            s3.create_bucket(Bucket="models")
            s3.upload_file(str(model), "models", "big/1/model.onnx")
            s3.put_object(Bucket="models", Key="manifest.toml", Body=manifest.read_bytes())
            base = {**os.environ, **aws_env(url), "FNSERVE_MODEL_CACHE_DIR": str(work / "tmp")}
            floor = FLOOR.replace("MODEL", repr(str(model)))
            api = API.replace("EVENT", repr(str(event_file)))
            rows = {
                "floor: onnxruntime session + one run": lambda: fresh_process_seconds(floor),
                "local file (layer or image)": lambda: fresh_process_seconds(
                    api, {**base, "FNSERVE_MANIFEST": str(manifest)}, REPO
                ),
                "ModelBucket (S3 -> /tmp)": lambda: (
                    clear(work / "tmp")
                    or fresh_process_seconds(api, {**base, "FNSERVE_MANIFEST": "s3://models/manifest.toml"}, REPO)
                ),
            }
            if shutil.which("buildah") and image_exists(IMAGE):
                rows["Lambda image (buildah run + Runtime API)"] = lambda: image_seconds(
                    manifest.parent, event_file, url
                )
            samples: dict[str, list[float]] = {name: [] for name in rows}
            for _ in range(COLD_RUNS):
                for name, run in rows.items():
                    samples[name].append(run())
        floor_s = statistics.median(samples["floor: onnxruntime session + one run"])
        print(f"cold start, a {size_mb:.0f} MB model, fresh process to first answer, median of {COLD_RUNS}:")
        for name, values in samples.items():
            median = statistics.median(values)
            print(
                f"  {name:42s} {median:6.2f} s  ({median / floor_s:.2f}x floor)  [{min(values):.2f}-{max(values):.2f}]"
            )
        if len(samples) < 4:
            print(f"  (no Lambda image row: build {IMAGE} with make image-test)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def clear(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
