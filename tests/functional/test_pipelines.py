"""Pipelines end to end: text and images in, embeddings and labels out, through every transport.

The demo manifest's pipelines on its real models: minilm-embed (all-MiniLM-L6-v2 int8 behind
tokenizers and mean pooling) checked against the package's own sentence-transformers
embeddings; digits-image (Pillow decoding in front of the digits models) on PNGs of the
held-out digits; their cascade; custom steps; and every kind of bad input, over HTTP and in
batch jobs, where a poison job is refused alone.
"""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image
from tritonclient.utils import InferenceServerException

from fnserve.adapters.http.app import create_app
from fnserve.adapters.lambda_.sqs import create_handler as create_sqs_handler
from fnserve.aws.events import LambdaContext, sqs_event
from fnserve.bootstrap import build_dataplane
from fnserve.core.errors import FnserveError, InferenceError, InvalidInput, ModelNotReady
from fnserve.core.execution.service import InferenceService
from fnserve.core.jobs.messages import job_message
from fnserve.settings import Settings
from fnserve.stores.dynamodb import DynamoResultStore
from tests.embeddings import REFERENCE, SENTENCES, cosine
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST
from tests.helpers.asgi import AsgiClient, Get
from tests.helpers.clouds import Aws, received_event
from tests.helpers.serving import Served
from tests.moto import free_port
from tests.servers import start_server

HOLDOUT = np.load(DEMO_HOLDOUT)
DIGITS, LABELS = HOLDOUT["input"], HOLDOUT["labels"]


def png(pixels: np.ndarray, mode: str = "L", size: int = 8) -> bytes:
    """A held-out digit (0-16 intensities, 64 of them) as a PNG, ``size`` pixels a side."""
    image = Image.fromarray(np.round(pixels.reshape(8, 8) * 255 / 16).astype(np.uint8), "L")
    image = image.resize((size, size), Image.Resampling.NEAREST).convert(mode)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


PNGS = [png(row) for row in DIGITS]


def encoded(image: Image.Image, format: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format, **options)
    return out.getvalue()


def huge_png() -> bytes:
    """A 60,000 x 60,000 PNG header in front of a few bytes: what a decompression bomb claims to be."""
    data = bytearray(PNGS[0])
    ihdr = struct.pack(">II", 60_000, 60_000) + data[24:29]
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def strings(*values: str | bytes) -> np.ndarray:
    return np.array(values, dtype=object)


# (pipeline, input, the request's tensor, what the 422 says)
BAD = {
    "non-utf8-text": ("minilm-embed", "text", strings(b"caf\xe9"), "text must be UTF-8"),
    "empty-text": ("minilm-embed", "text", strings(""), "text is empty"),
    "blank-text": ("minilm-embed", "text", strings(" \n"), "text is empty"),
    "text-wrong-shape": ("minilm-embed", "text", strings("a", "b").reshape(1, 2), "must have rank 1"),  # [n, 1] is [n]
    "text-empty-batch": ("minilm-embed", "text", strings(), "is an empty batch"),
    "text-as-numbers": ("minilm-embed", "text", np.ones(2, np.float32), "must be BYTES"),
    "corrupt-image": ("digits-image", "image", strings(b"\x89PNG not really"), "not a JPEG, PNG or WebP image"),
    "truncated-image": ("digits-image", "image", strings(PNGS[0][:60]), "corrupt or truncated"),
    "decompression-bomb": ("digits-image", "image", strings(huge_png()), "over the limit of 40000000 pixels"),
    "16-bit-image": (
        "digits-image",
        "image",
        strings(encoded(Image.fromarray(np.full((8, 8), 4000, np.uint16)), "PNG")),
        "not supported (8-bit images only)",
    ),
    "gif-image": ("digits-image", "image", strings(encoded(Image.new("L", (8, 8)), "GIF")), "not a JPEG, PNG or WebP"),
    "empty-image": ("digits-image", "image", strings(b""), "the image is empty"),
    "image-not-base64-in-json": ("digits-image", "image", strings("not base64!"), "nor one in base64"),
    "image-wrong-shape": ("digits-image", "image", strings(PNGS[0], PNGS[1]).reshape(1, 2), "must have rank 1"),
}


@pytest.fixture(scope="module")
def service() -> InferenceService:
    return InferenceService.from_manifest(DEMO_MANIFEST)


# -- the demo pipelines, in process ------------------------------------------------------------


def test_metadata_shows_the_pipelines_own_tensors(service: InferenceService) -> None:
    assert service.model_metadata("minilm-embed") == {
        "name": "minilm-embed",
        "versions": [],
        "platform": "fnserve_pipeline",
        # One text a row, as Triton describes it (dims [1] reshaped to []): [n, 1] and [n] are both taken.
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}],
    }
    meta = service.model_metadata("digits-image")
    assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("label", "INT64", [-1]),
        ("probabilities", "FP32", [-1, 10]),
        ("labels", "BYTES", [-1, 3]),
        ("scores", "FP32", [-1, 3]),
    ]
    with pytest.raises(
        FnserveError,
        match="Request for unknown model: 'minilm-embed' version 1 is not found: a pipeline has no versions",
    ):
        service.model_metadata("minilm-embed", "1")


def test_minilm_embed_matches_sentence_transformers(service: InferenceService) -> None:
    # 242 sentences (four chunks of max_batch_size 64), one of them far over 256 tokens.
    got = service.infer("minilm-embed", {"text": strings(*SENTENCES)})
    embedding = got.outputs["embedding"]
    assert embedding.shape == (len(SENTENCES), 384) and embedding.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)
    similarity = cosine(embedding, REFERENCE)
    # The per-token int8 model against fp32 sentence-transformers (the fp32 export is >= 0.99999 on every sentence):
    # nearest on average, furthest on the shortest texts, whose few tokens are most of them [CLS] and [SEP].
    assert similarity.mean() >= 0.999 and similarity.min() >= 0.995, (similarity.mean(), similarity.min())
    assert got.model == "minilm-l6" and got.timings is not None and set(got.timings) == {"pre", "post"}
    # A row alone, or among longer texts: padding is masked and each row quantized by its own range.
    alone = service.infer("minilm-embed", {"text": strings(SENTENCES[3])}).outputs["embedding"]
    np.testing.assert_allclose(alone[0], embedding[3], atol=1e-5)


def test_a_megabyte_of_text_is_truncated_not_refused(service: InferenceService) -> None:
    huge = "serverless " * 100_000  # 1.1 MB
    long_enough = "serverless " * 300  # also past 256 tokens: the same first 256
    out = service.predict("minilm-embed", {"text": strings(huge, long_enough)})["embedding"]
    assert out.shape == (2, 384)
    assert cosine(out[:1], out[1:])[0] > 0.9999


def test_digits_image_is_as_accurate_as_the_tensor_path(service: InferenceService) -> None:
    images = service.predict("digits-image", {"image": np.array(PNGS, dtype=object)})
    tensors = service.predict("digits-accurate", {"input": DIGITS})
    np.testing.assert_array_equal(images["label"], tensors["label"])
    assert np.mean(images["label"] == LABELS) == np.mean(tensors["label"] == LABELS) > 0.95
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert [row[0].decode() for row in images["labels"]] == [names[i] for i in tensors["label"]]
    np.testing.assert_array_equal(images["scores"][:, 0], images["probabilities"].max(axis=1))
    assert np.all(np.diff(images["scores"], axis=1) <= 0)  # best first


def test_images_of_any_size_format_and_mode_are_decoded_alike(service: InferenceService) -> None:
    rgb = Image.open(io.BytesIO(png(DIGITS[0], size=64))).convert("RGB")
    forms = [
        png(DIGITS[0]),
        png(DIGITS[0], size=64),  # resized down to 8x8
        png(DIGITS[0], mode="RGBA", size=32),
        encoded(rgb, "WEBP", lossless=True),
        encoded(rgb, "JPEG", quality=95),
        encoded(rgb.convert("P"), "PNG"),
    ]
    labels = service.predict("digits-image", {"image": np.array(forms, dtype=object)})["label"]
    assert labels.tolist() == [LABELS[0]] * len(forms)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_with_what_is_wrong(service: InferenceService, case: str) -> None:
    pipeline, name, value, message = BAD[case]
    with pytest.raises(InvalidInput, match=re.escape(message)):
        service.infer(pipeline, {name: value})


def test_one_bad_row_names_itself(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match="input 'image' row 2: the image is corrupt or truncated"):
        service.infer("digits-image", {"image": strings(PNGS[0], PNGS[1], PNGS[2][:50])})


def test_unknown_outputs_and_inputs_of_a_pipeline(service: InferenceService) -> None:
    with pytest.raises(InvalidInput, match=r"pipeline 'digits-image' has no outputs \['embedding'\]"):
        service.infer("digits-image", {"image": strings(PNGS[0])}, outputs=["embedding"])
    with pytest.raises(InvalidInput, match=r"pipeline 'minilm-embed' takes inputs \['text'\]"):
        service.infer("minilm-embed", {"input_ids": np.ones((1, 4), np.int64)})
    only = service.infer("digits-image", {"image": strings(PNGS[0])}, outputs=["labels"]).outputs
    assert list(only) == ["labels"]


# -- custom steps ----------------------------------------------------------------------------------

STEPS_MODULE = """
import numpy as np
from fnserve.core.errors import InvalidInput

calls = []


def flatten(tensors):
    pixels = tensors["pixels"]
    calls.append(len(pixels))
    if (pixels > 16).any():
        raise InvalidInput("pixels run from 0 to 16")
    if (pixels < 0).any():
        raise RuntimeError("a bug in the step")
    return {"input": pixels.reshape(len(pixels), 64)}


def odd_or_even(tensors):
    return {"parity": np.where(tensors["label"] % 2 == 0, b"even", b"odd").astype(object)}
"""


def custom_manifest(directory: Path, cache_ttl: int | None = None) -> Path:
    (directory / "digit_steps.py").write_text(STEPS_MODULE)
    model = DEMO_MANIFEST.parent / "digits-accurate" / "1" / "model.onnx"
    sha = next(m for m in _demo()["models"] if m["name"] == "digits-accurate")["sha256"]
    cache = f"cache_ttl_seconds = {cache_ttl}\n" if cache_ttl else ""
    manifest = directory / "manifest.toml"
    manifest.write_text(
        f'[[models]]\nname = "digits-accurate"\npath = "{model}"\nsha256 = "{sha}"\nmax_batch_size = 7\n\n'
        f'[[pipelines]]\nname = "grid-digits"\nmodel = "digits-accurate"\n{cache}outputs = ["label", "parity"]\n\n'
        '[[pipelines.pre]]\nstep = "custom"\nfunction = "digit_steps:flatten"\n'
        'inputs = [{name = "pixels", datatype = "FP32", shape = [-1, 8, 8]}]\n'
        'outputs = [{name = "input", datatype = "FP32", shape = [-1, 64]}]\n\n'
        '[[pipelines.post]]\nstep = "custom"\nfunction = "digit_steps:odd_or_even"\n'
        'inputs = [{name = "label", datatype = "INT64", shape = [-1]}]\n'
        'outputs = [{name = "parity", datatype = "BYTES", shape = [-1]}]\n'
    )
    return manifest


def _demo() -> dict[str, Any]:
    import tomllib

    return tomllib.loads(DEMO_MANIFEST.read_text())


def test_custom_steps_run_around_the_model_chunk_by_chunk(tmp_path: Path) -> None:
    service = InferenceService.from_manifest(custom_manifest(tmp_path), eager=True)
    assert service.model_metadata("grid-digits")["inputs"] == [
        {"name": "pixels", "datatype": "FP32", "shape": [-1, 8, 8]}
    ]
    out = service.predict("grid-digits", {"pixels": DIGITS[:20].reshape(20, 8, 8)})
    np.testing.assert_array_equal(out["label"], service.predict("digits-accurate", {"input": DIGITS[:20]})["label"])
    assert out["parity"].tolist() == [b"even" if label % 2 == 0 else b"odd" for label in out["label"]]
    import digit_steps  # type: ignore[import-not-found]  # loaded from beside the manifest

    assert digit_steps.calls[-3:] == [7, 7, 6]  # max_batch_size 7: three chunks, each through the steps


def test_a_custom_step_refuses_with_its_message_and_a_bug_is_a_logged_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = InferenceService.from_manifest(custom_manifest(tmp_path))
    grid = DIGITS[:2].reshape(2, 8, 8)
    with pytest.raises(InvalidInput, match="pixels run from 0 to 16"):
        service.infer("grid-digits", {"pixels": grid + 100})
    with pytest.raises(InferenceError, match="step digit_steps:flatten failed: RuntimeError") as raised:
        service.infer("grid-digits", {"pixels": grid - 100})
    assert raised.value.status_code == 500
    assert "a bug in the step" in caplog.text and "Traceback" in caplog.text
    assert service.predict("grid-digits", {"pixels": grid})["label"].shape == (2,)  # and it goes on


def test_a_pipeline_that_cannot_be_built_is_not_ready(tmp_path: Path) -> None:
    manifest = custom_manifest(tmp_path)
    manifest.write_text(manifest.read_text().replace("digit_steps:flatten", "digit_steps:nothing"))
    service = InferenceService.from_manifest(manifest)
    assert service.model_ready("digits-accurate") and not service.model_ready("grid-digits")
    with pytest.raises(ModelNotReady, match="'digit_steps' has no function 'nothing'"):
        service.infer("grid-digits", {"pixels": DIGITS[:1].reshape(1, 8, 8)})


def test_pipeline_answers_are_cached_by_their_raw_inputs(tmp_path: Path) -> None:
    from fnserve.core.execution.cache import ResultCache

    service = InferenceService(
        InferenceService.from_manifest(custom_manifest(tmp_path, 60)).registry, ResultCache(1 << 20)
    )
    grid = {"pixels": DIGITS[:3].reshape(3, 8, 8)}
    first, second = service.infer("grid-digits", grid), service.infer("grid-digits", grid)
    assert (first.cache, second.cache) == ("miss", "hit")
    np.testing.assert_array_equal(first.outputs["parity"], second.outputs["parity"])
    assert service.infer("grid-digits", grid, outputs=["label"]).cache == "miss"  # other outputs: another key


# -- over HTTP (the Lambda app), in batch jobs and in a cascade ------------------------------------


def binary_body(inputs: dict[str, np.ndarray], outputs: list[str] | None = None) -> tuple[bytes, dict[str, str]]:
    """A V2 request with every tensor in the binary extension (how an image travels unencoded)."""
    from fnserve.core.codec.tensors import binary_tensor

    tensors, blobs = [], []
    for name, array in inputs.items():
        blob = binary_tensor(array, "BYTES" if array.dtype == object else "FP32")
        datatype = "BYTES" if array.dtype == object else "FP32"
        tensors.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    header: dict[str, Any] = {"inputs": tensors}
    if outputs:
        header["outputs"] = [{"name": n} for n in outputs]
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


@pytest.fixture
def settings(aws: Aws) -> Settings:
    return Settings(
        manifest=DEMO_MANIFEST, results_table=aws.table, results_bucket=aws.bucket, followup_queue_url=aws.queue_url
    )


def test_text_and_images_over_http(settings: Settings, service: InferenceService) -> None:
    client = AsgiClient(
        create_app(build_dataplane(settings, store=DynamoResultStore(settings.results_table or "")), settings)
    )
    text = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": SENTENCES[:2]}]}
    response = client.post("/v2/models/minilm-embed/infer", json=text)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["model_name"] == "minilm-embed"
    assert doc["outputs"][0]["name"] == "embedding" and doc["outputs"][0]["shape"] == [2, 384]
    np.testing.assert_allclose(
        np.reshape(doc["outputs"][0]["data"], (2, 384)),
        service.predict("minilm-embed", {"text": strings(*SENTENCES[:2])})["embedding"],
        atol=1e-5,
    )
    timing = response.headers["server-timing"]
    assert "pre;dur=" in timing and "post;dur=" in timing and "infer;dur=" in timing
    body, headers = binary_body({"image": strings(PNGS[0], PNGS[1])}, outputs=["label", "labels"])
    response = client.post("/v2/models/digits-image/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["label"]["data"] == LABELS[:2].tolist()
    assert outputs["labels"]["shape"] == [2, 3]
    # JSON carries no raw bytes: there an image is base64.
    encoded = base64.b64encode(PNGS[4]).decode()
    image = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [encoded]}]}
    response = client.post("/v2/models/digits-image/infer", json=image)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [int(LABELS[4])]


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_over_http_is_a_422_with_what_is_wrong(settings: Settings, case: str) -> None:
    client = AsgiClient(create_app(build_dataplane(settings), settings))
    pipeline, name, value, message = BAD[case]
    if value.dtype == object and any(isinstance(v, bytes) for v in value.ravel()):
        body, headers = binary_body({name: value})
        response = client.post(f"/v2/models/{pipeline}/infer", content=body, headers=headers)
    else:
        datatype = "BYTES" if value.dtype == object else "FP32"
        tensor = {"name": name, "shape": list(value.shape), "datatype": datatype, "data": value.ravel().tolist()}
        response = client.post(f"/v2/models/{pipeline}/infer", json={"inputs": [tensor]})
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]
    good = client.post(
        "/v2/models/minilm-embed/infer",
        json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]},
    )
    assert good.status_code == 200


def test_jobs_carry_text_and_images_and_a_poison_job_fails_alone(settings: Settings, service: InferenceService) -> None:
    texts = {f"text-{i}": SENTENCES[i] for i in range(12)}
    bodies = [json.dumps(job_message(job_id, "minilm-embed", {"text": strings(t)})) for job_id, t in texts.items()]
    bodies += [
        json.dumps(job_message(f"image-{i}", "digits-image", {"image": strings(PNGS[i])}, binary=True))
        for i in range(5)
    ]
    poison = {f"poison-{case}": BAD[case] for case in sorted(BAD)}
    for job_id, (pipeline, name, value, _) in poison.items():
        bodies.append(json.dumps(job_message(job_id, pipeline, {name: value}, binary=True)))
    handler = create_sqs_handler(settings=settings)
    event = sqs_event(bodies)
    assert handler(event, LambdaContext()) == {"batchItemFailures": []}  # refused jobs are stored, not retried
    get = Get(
        AsgiClient(
            create_app(build_dataplane(settings, store=DynamoResultStore(settings.results_table or "")), settings)
        )
    )
    expected = service.predict("minilm-embed", {"text": strings(*texts.values())})["embedding"]
    for i, job_id in enumerate(texts):
        result = get(f"/v2/results/{job_id}").json()
        assert result["status"] == "done", result
        # What the job called, and the model that computed it beside (its version is that model's).
        assert result["model_name"] == "minilm-embed" and result["parameters"] == {"answered_by": "minilm-l6"}
        got = np.reshape(result["outputs"][0]["data"], (1, 384))
        assert cosine(got, expected[i : i + 1])[0] > 0.98  # int8: batched with other lengths, alike
    for i in range(5):
        result = get(f"/v2/results/image-{i}").json()
        assert (result["model_name"], result["parameters"]["answered_by"]) == ("digits-image", "digits-accurate")
        outputs = {o["name"]: o for o in result["outputs"]}
        assert outputs["label"]["data"] == [int(LABELS[i])]
    for job_id, (_, _, _, message) in poison.items():
        result = get(f"/v2/results/{job_id}").json()
        assert result["status"] == "failed" and message in result["error"], (job_id, result)


def test_the_digits_cascade_takes_png_bytes(settings: Settings) -> None:
    from tests.helpers.cascade import CORRECTED, FAST_LABEL

    client = AsgiClient(
        create_app(build_dataplane(settings, store=DynamoResultStore(settings.results_table or "")), settings)
    )
    i = CORRECTED[0]
    body, headers = binary_body({"image": strings(PNGS[i])})
    response = client.post("/v2/models/digits-image-cascade/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    doc = response.json()
    params = doc["parameters"]
    assert params["answered_by"] == "digits-fast" and params["followup_status"] == "pending"
    assert {o["name"]: o for o in doc["outputs"]}["label"]["data"] == [int(FAST_LABEL[i])]
    handler = create_sqs_handler(settings=settings)
    assert handler(received_event(Aws("", "", "", settings.followup_queue_url or "", ""), 1), LambdaContext()) == {
        "batchItemFailures": []
    }
    result = Get(client)(params["followup_url"]).json()
    assert result["status"] == "done", result
    outputs = {o["name"]: o for o in result["outputs"]}
    assert outputs["label"]["data"] == [int(LABELS[i])]  # corrected by the accurate pipeline
    assert outputs["labels"]["shape"] == [1, 3]


# -- a long-running server: batched, over tritonclient -----------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``fnserve serve`` on the demo manifest: one inference worker (the steps stay in front), and gRPC."""
    log = tmp_path_factory.mktemp("pipelines") / "serve.log"
    port = free_port()
    options = ["-m", str(DEMO_MANIFEST), "--workers", "1", "--processes", "1", "--grpc-port", str(port)]
    proc, url = start_server(options, log)
    yield Served(proc, f"127.0.0.1:{port}", log, url)
    proc.terminate()
    proc.wait(timeout=30)


def test_text_and_images_over_grpc(served: Served, service: InferenceService) -> None:
    import tritonclient.grpc as triton_grpc

    with triton_grpc.InferenceServerClient(served.address) as client:
        assert client.get_model_metadata("minilm-embed").inputs[0].datatype == "BYTES"
        text = triton_grpc.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(strings(SENTENCES[0].encode(), SENTENCES[1].encode()))
        embedding = client.infer("minilm-embed", [text]).as_numpy("embedding")
        expected = service.predict("minilm-embed", {"text": strings(*SENTENCES[:2])})["embedding"]
        assert embedding.shape == (2, 384) and cosine(embedding, expected).min() > 0.98
        image = triton_grpc.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(strings(PNGS[5]))
        assert client.infer("digits-image", [image]).as_numpy("label").tolist() == [LABELS[5]]
        bad = triton_grpc.InferInput("text", [1], "BYTES")
        bad.set_data_from_numpy(strings(b"\xff\xfe"))
        with pytest.raises(InferenceServerException, match="text must be UTF-8") as raised:
            client.infer("minilm-embed", [bad])
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"


def batches(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    prefix = 'fnserve_batch_size_count{model="minilm-l6"}'
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix))


def test_concurrent_texts_batch_together_and_each_gets_its_own_answer(
    served: Served, service: InferenceService
) -> None:
    chosen = SENTENCES[:40]
    got: dict[int, np.ndarray] = {}
    before = batches(served.url)

    def post(i: int) -> None:
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [chosen[i]]}]}
        response = httpx.post(f"{served.url}/v2/models/minilm-embed/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        got[i] = np.reshape(response.json()["outputs"][0]["data"], (1, 384))

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(chosen))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = service.predict("minilm-embed", {"text": strings(*chosen)})["embedding"]
    assert cosine(np.concatenate([got[i] for i in range(len(chosen))]), expected).min() > 0.98
    assert batches(served.url) - before < len(chosen)  # fewer batches than requests: batched together


def test_tritonclient_sends_text_and_images_as_bytes(served: Served, service: InferenceService) -> None:
    client = triton.InferenceServerClient(served.url.removeprefix("http://"))
    assert client.get_model_metadata("minilm-embed")["outputs"][0]["shape"] == [-1, 384]
    text = triton.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(strings(SENTENCES[0].encode(), SENTENCES[1].encode()), binary_data=True)
    embedding = client.infer("minilm-embed", [text]).as_numpy("embedding")
    expected = service.predict("minilm-embed", {"text": strings(*SENTENCES[:2])})["embedding"]
    assert embedding.shape == (2, 384) and cosine(embedding, expected).min() > 0.98
    image = triton.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(strings(PNGS[3]), binary_data=True)
    result = client.infer("digits-image", [image])
    assert result.as_numpy("label").tolist() == [LABELS[3]]
    assert result.as_numpy("labels").shape == (1, 3)
    client.close()


def test_a_bad_text_does_not_fail_the_batch_it_would_have_joined(served: Served) -> None:
    results: dict[str, httpx.Response] = {}

    def post(key: str, data: list[str]) -> None:
        body = {"inputs": [{"name": "text", "shape": [len(data)], "datatype": "BYTES", "data": data}]}
        results[key] = httpx.post(f"{served.url}/v2/models/minilm-embed/infer", json=body, timeout=30)

    threads = [threading.Thread(target=post, args=(f"good-{i}", [SENTENCES[i]])) for i in range(6)]
    threads.append(threading.Thread(target=post, args=("bad", [""])))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["bad"].status_code == 422 and "text is empty" in results["bad"].json()["error"]
    assert all(results[f"good-{i}"].status_code == 200 for i in range(6))


def test_a_custom_steps_module_runs_only_with_the_sha256_the_manifest_gives(tmp_path: Path) -> None:
    """The model bucket is a code path: a step's module changed after its manifest was written never runs."""
    import hashlib
    import uuid

    name = f"checked_steps_{uuid.uuid4().hex[:8]}"
    source = STEPS_MODULE + f"\nimport pathlib\npathlib.Path({str(tmp_path / 'ran')!r}).write_text('ran')\n"
    manifest = custom_manifest(tmp_path)
    (tmp_path / f"{name}.py").write_text(source)
    text = manifest.read_text().replace("digit_steps:flatten", f"{name}:flatten")
    digest = hashlib.sha256(source.encode()).hexdigest()
    manifest.write_text(
        text.replace(f'function = "{name}:flatten"\n', f'function = "{name}:flatten"\nsha256 = "{"0" * 64}"\n')
    )
    service = InferenceService.from_manifest(manifest)
    with pytest.raises(ModelNotReady, match=f"has sha256 {digest}, not the manifest's 0{{64}}: refused"):
        service.infer("grid-digits", {"pixels": DIGITS[:1].reshape(1, 8, 8)})
    assert not (tmp_path / "ran").exists()  # refused before a line of it ran

    manifest.write_text(
        text.replace(f'function = "{name}:flatten"\n', f'function = "{name}:flatten"\nsha256 = "{digest}"\n')
    )
    service = InferenceService.from_manifest(manifest)
    assert service.predict("grid-digits", {"pixels": DIGITS[:2].reshape(2, 8, 8)})["label"].shape == (2,)
    assert (tmp_path / "ran").exists()
