"""``fnserve manifest add`` and ``fnserve models push``: entries nobody types by hand, served from a bucket."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from fnserve.adapters.http.app import create_app
from fnserve.aws import clients
from fnserve.bootstrap import build_dataplane, build_service
from fnserve.cli import app
from fnserve.core.models.manifest.loading import load_manifest
from fnserve.settings import Settings
from tests.helpers import DEMO_HOLDOUT, DEMO_MANIFEST, save_with_external_data
from tests.helpers.asgi import AsgiClient
from tests.helpers.clouds import Aws, Gcs
from tests.moto import aws_env, moto_server

runner = CliRunner()
MODELS = DEMO_MANIFEST.parent
ACCURATE = MODELS / "digits-accurate" / "1" / "model.onnx"
DIGITS = np.load(DEMO_HOLDOUT)["input"][:8]


def fnserve(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def refused(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 1, result.output
    return result.output


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of the demo models' folder (manifest, models, tokenizer, labels): its manifest."""
    shutil.copytree(MODELS, tmp_path / "models")
    return tmp_path / "models" / "manifest.toml"


def test_add_appends_an_entry_and_leaves_the_rest_of_the_file_as_it_was(demo: Path, tmp_path: Path) -> None:
    before = demo.read_text()
    outside = tmp_path / "exported.onnx"
    shutil.copyfile(ACCURATE, outside)
    output = fnserve("manifest", "add", str(outside), "--name", "mine", "-m", str(demo), "--max-batch-size", "64")
    assert "input  input            FP32   [-1, 64]" in output and "output probabilities    FP32   [-1, 10]" in output
    assert demo.read_text().startswith(before)  # comments and order kept: the entry is appended
    copied = demo.parent / "mine" / "1" / "model.onnx"
    assert copied.read_bytes() == ACCURATE.read_bytes()

    mine = next(m for m in load_manifest(demo).models if m.name == "mine")
    assert (mine.version, mine.path, mine.max_batch_size) == ("1", "mine/1/model.onnx", 64)
    assert mine.sha256 == hashlib.sha256(ACCURATE.read_bytes()).hexdigest()
    # A second add is the next version; a file already beside the manifest is named where it is.
    fnserve("manifest", "add", str(demo.parent / "digits-fast" / "1" / "model.onnx"), "-n", "mine", "-m", str(demo))
    second = next(m for m in load_manifest(demo).models if m.name == "mine" and m.version == "2")
    assert second.path == "digits-fast/1/model.onnx"
    assert not (demo.parent / "mine" / "2").exists()

    served = build_service(Settings(manifest=str(demo)))
    expected = ort.InferenceSession(str(ACCURATE)).run(["label"], {"input": DIGITS})[0]
    np.testing.assert_array_equal(served.predict("mine", {"input": DIGITS}, version="1")["label"], expected)


def test_add_creates_a_manifest_and_no_copy_names_the_file_where_it_is(tmp_path: Path) -> None:
    manifest = tmp_path / "new" / "manifest.toml"
    manifest.parent.mkdir()
    fnserve("manifest", "add", str(ACCURATE), "-n", "accurate", "-m", str(manifest), "--no-copy", "--version", "7")
    (entry,) = load_manifest(manifest).models
    assert (entry.name, entry.version, entry.path) == ("accurate", "7", str(ACCURATE))
    assert manifest.read_text().startswith("# fnserve model manifest")


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--name", "digits-fast", "--version", "1"], "already has model 'digits-fast' version '1'"),
        (["--name", "bad name"], "model name 'bad name' is not allowed"),
        (["--name", "digits"], "already a model's"),  # the cascade's name
    ],
)
def test_add_refuses_clearly_and_changes_nothing(demo: Path, args: list[str], reason: str) -> None:
    before = sorted(p for p in demo.parent.rglob("*"))
    text = demo.read_text()
    output = refused("manifest", "add", str(ACCURATE), *args, "-m", str(demo))
    assert reason in output
    assert demo.read_text() == text and sorted(demo.parent.rglob("*")) == before


def test_add_names_the_field_the_manifest_refuses(tmp_path: Path) -> None:
    from fnserve.core.errors import ConfigError
    from fnserve.core.models.writing import add_model

    manifest = tmp_path / "manifest.toml"
    with pytest.raises(ConfigError, match="cannot be added: max_batch_size: Expected `int` >= 1$"):
        add_model(manifest, ACCURATE, "accurate", max_batch_size=0, copy=False)
    assert not manifest.exists()


def test_add_refuses_a_file_that_is_not_a_model(demo: Path) -> None:
    text = demo.read_text()
    assert "is not a model onnxruntime can load" in refused("manifest", "add", str(demo), "-n", "x", "-m", str(demo))
    assert "does not exist" in refused("manifest", "add", "nope.onnx", "-n", "x", "-m", str(demo))
    assert demo.read_text() == text


def test_push_uploads_every_file_and_the_bucket_manifest_serves_models_and_pipelines(
    aws: Aws, demo: Path, tmp_path: Path
) -> None:
    s3 = clients.client("s3")
    destination = f"s3://{aws.bucket}/models/v1"
    output = fnserve("models", "push", destination, "-m", str(demo))
    assert f"FNSERVE_MANIFEST={destination}/manifest.toml" in output
    assert f"ModelBucket={aws.bucket} ModelManifestKey=models/v1/manifest.toml" in output
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=aws.bucket, Prefix="models/")["Contents"]}
    assert {
        "models/v1/manifest.toml",
        "models/v1/digits-accurate/1/model.onnx",
        "models/v1/minilm-l6/1/model.onnx",
        "models/v1/minilm-l6/tokenizer.json",
        "models/v1/digits-labels.txt",
    } <= keys

    published = s3.get_object(Bucket=aws.bucket, Key="models/v1/manifest.toml")["Body"].read().decode()
    assert f'path = "{destination}/digits-fast/1/model.onnx"' in published
    service = build_service(Settings(manifest=f"{destination}/manifest.toml", model_cache_dir=tmp_path / "cache"))
    service.load_all()  # every model fetched and checked, every pipeline built from its fetched files
    local = build_service(Settings(manifest=str(demo)))
    text = np.array([b"a sentence to embed"], dtype=object)
    np.testing.assert_allclose(
        service.predict("minilm-embed", {"text": text})["embedding"],
        local.predict("minilm-embed", {"text": text})["embedding"],
        atol=1e-6,
    )
    np.testing.assert_array_equal(
        service.predict("digits-accurate", {"input": DIGITS})["label"],
        local.predict("digits-accurate", {"input": DIGITS})["label"],
    )

    # Pushed again unchanged: only the manifest is sent.
    again = fnserve("models", "push", destination, "-m", str(demo))
    assert again.count("uploaded") == 1 and f"uploaded   {destination}/manifest.toml" in again
    assert f"unchanged  {destination}/minilm-l6/1/model.onnx" in again


def test_push_refuses_a_model_that_does_not_match_its_sha256_before_uploading_anything(aws: Aws, demo: Path) -> None:
    (demo.parent / "digits-fast" / "1" / "model.onnx").write_bytes(ACCURATE.read_bytes())
    output = refused("models", "push", f"s3://{aws.bucket}/models", "-m", str(demo))
    assert "model 'digits-fast' version '1'" in output and "but the manifest says" in output
    assert "Contents" not in clients.client("s3").list_objects_v2(Bucket=aws.bucket, Prefix="models/")


def test_push_refuses_a_destination_that_is_not_a_bucket(demo: Path) -> None:
    output = refused("models", "push", "/tmp/x", "-m", str(demo))
    assert "must be s3://bucket[/prefix] or gs://bucket[/prefix]" in output


# What an identity may do on the model bucket, as docs/aws-permissions.md lists it for `fnserve models push` (no
# s3:ListBucket), and with one of the two left out.
MODEL_BUCKET_GRANTS = {
    "documented": ["s3:PutObject", "s3:GetObject"],
    "put-only": ["s3:PutObject"],
    "get-only": ["s3:GetObject"],
}


@pytest.fixture
def pushers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, dict[str, str]]]:
    """A moto server of its own that enforces IAM, a bucket ``models`` in it, and an IAM user for each of
    MODEL_BUCKET_GRANTS holding only those actions on the bucket's objects: their access keys, by name."""
    with moto_server(tmp_path / "moto.log") as url:
        for key, value in aws_env(url).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("LOCALSTACK_HOST", raising=False)
        clients.reset()
        clients.client("s3").create_bucket(Bucket="models")
        iam = clients.client("iam")
        keys = {}
        for user, actions in MODEL_BUCKET_GRANTS.items():
            iam.create_user(UserName=user)
            statement = {"Effect": "Allow", "Action": actions, "Resource": "arn:aws:s3:::models/*"}
            document = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
            iam.put_user_policy(UserName=user, PolicyName="model-bucket", PolicyDocument=document)
            keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
        httpx.post(f"{url}/moto-api/reset-auth", content=b"0").raise_for_status()  # every call from here is checked
        monkeypatch.delenv("AWS_SESSION_TOKEN")
        yield {
            user: {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
            for user, key in keys.items()
        }
    clients.reset()


def as_user(credentials: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in credentials.items():
        monkeypatch.setenv(key, value)
    clients.reset()


def test_push_to_cloud_storage_then_served_from_there(gcs: Gcs, demo: Path, tmp_path: Path) -> None:
    from fnserve.stores import gcs as storage

    bucket = storage.client().create_bucket(f"models-{uuid.uuid4().hex[:8]}").name
    fnserve("models", "push", f"gs://{bucket}", "-m", str(demo))
    again = fnserve("models", "push", f"gs://{bucket}", "-m", str(demo))
    assert again.count("uploaded") == 1 and f"unchanged  gs://{bucket}/digits-labels.txt" in again
    service = build_service(Settings(manifest=f"gs://{bucket}/manifest.toml", model_cache_dir=tmp_path / "cache"))
    service.load_all()
    expected = ort.InferenceSession(str(ACCURATE)).run(["label"], {"input": DIGITS})[0]
    np.testing.assert_array_equal(service.predict("digits-accurate", {"input": DIGITS})["label"], expected)


def test_a_read_that_cloud_storage_refuses_is_taken_as_absent_and_the_upload_decides(
    gcs: Gcs, demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pusher with roles/storage.objectCreator may create objects but not read them: Cloud Storage answers its
    read with a 403 (the emulator has no IAM, so the answer is injected), and push uploads everything. Any other
    failure of the read is still an error."""
    from google.api_core import exceptions as api
    from google.cloud.storage import Bucket

    from fnserve.stores import gcs as storage

    bucket = storage.client().create_bucket(f"models-{uuid.uuid4().hex[:8]}").name

    def refused(self: Bucket, name: str, *args: object, **kwargs: object) -> None:
        raise api.Forbidden(f"caller does not have storage.objects.get access to {name}")

    monkeypatch.setattr(Bucket, "get_blob", refused)
    for _ in range(2):  # nothing is known to be there, so everything is sent each time
        output = fnserve("models", "push", f"gs://{bucket}", "-m", str(demo))
        assert "unchanged" not in output and f"uploaded   gs://{bucket}/digits-labels.txt" in output

    def down(self: Bucket, name: str, *args: object, **kwargs: object) -> None:
        raise api.ServiceUnavailable("backend unavailable")

    monkeypatch.setattr(Bucket, "get_blob", down)
    result = runner.invoke(app, ["models", "push", f"gs://{bucket}", "-m", str(demo)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"gs://{bucket}/" in result.output and "cannot be read" in result.output, result.output


def test_push_needs_only_the_documented_permissions_not_list_bucket(
    pushers: dict[str, dict[str, str]], demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(pushers["documented"], monkeypatch)
    with pytest.raises(ClientError, match="AccessDenied"):
        clients.client("s3").list_objects_v2(Bucket="models")  # IAM is enforced, and lists are not allowed
    first = fnserve("models", "push", "s3://models/fresh", "-m", str(demo))
    assert "unchanged" not in first and "uploaded   s3://models/fresh/minilm-l6/1/model.onnx" in first
    again = fnserve("models", "push", "s3://models/fresh", "-m", str(demo))  # s3:GetObject lets it read what is there
    assert again.count("uploaded") == 1 and "unchanged  s3://models/fresh/minilm-l6/1/model.onnx" in again


def test_a_head_that_s3_refuses_is_taken_as_absent_and_the_upload_decides(
    pushers: dict[str, dict[str, str]], demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without s3:ListBucket, S3 refuses a HeadObject of a missing key with a 403 (moto answers 404, so here a
    user without s3:GetObject gets the 403): push uploads. Without s3:PutObject, the upload fails and says so."""
    as_user(pushers["put-only"], monkeypatch)
    for _ in range(2):  # nothing is known to be there, so everything is sent each time
        output = fnserve("models", "push", "s3://models/blind", "-m", str(demo))
        assert "unchanged" not in output and "uploaded   s3://models/blind/digits-labels.txt" in output

    as_user(pushers["get-only"], monkeypatch)
    result = runner.invoke(app, ["models", "push", "s3://models/read-only", "-m", str(demo)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert re.search(r"error: s3://models/read-only/\S+ cannot be written: access denied", result.output), result.output


# External data: a graph whose weights are in a file beside it (digits-accurate saved so, beside the demo's models).
EXPECTED = ort.InferenceSession(str(ACCURATE)).run(["label", "probabilities"], {"input": DIGITS})


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """digits-accurate saved with its weights in model.onnx.data beside it, outside the demo's folder."""
    save_with_external_data(tmp_path / "export" / "model.onnx")
    return tmp_path / "export" / "model.onnx"


def test_add_copies_a_graphs_data_file_beside_it_and_lists_it_and_the_copy_serves(demo: Path, exported: Path) -> None:
    output = fnserve("manifest", "add", str(exported), "-n", "ext", "-m", str(demo))
    copied = demo.parent / "ext" / "1"
    assert f"copied {exported.parent / 'model.onnx.data'} to {copied / 'model.onnx.data'}" in output
    assert sorted(p.name for p in copied.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert (copied / "model.onnx.data").read_bytes() == (exported.parent / "model.onnx.data").read_bytes()
    entry = next(m for m in load_manifest(demo).models if m.name == "ext")
    digest = hashlib.sha256((exported.parent / "model.onnx.data").read_bytes()).hexdigest()
    assert entry.external_data == {"model.onnx.data": digest}
    assert f'[models.external_data]\n"model.onnx.data" = "{digest}"' in demo.read_text()

    answered = build_service(Settings(manifest=str(demo))).predict("ext", {"input": DIGITS})
    np.testing.assert_array_equal(answered["label"], EXPECTED[0])
    np.testing.assert_allclose(answered["probabilities"], EXPECTED[1], rtol=1e-6)


def test_add_lists_every_file_of_a_graph_saved_a_file_per_tensor(tmp_path: Path) -> None:
    exported = tmp_path / "export" / "model.onnx"
    save_with_external_data(exported, one_file=False)
    manifest = tmp_path / "models" / "manifest.toml"
    manifest.parent.mkdir()
    fnserve("manifest", "add", str(exported), "-n", "ext", "-m", str(manifest))
    (entry,) = load_manifest(manifest).models
    beside = sorted(p.name for p in exported.parent.iterdir() if p.name != "model.onnx")
    assert len(beside) > 1 and sorted(entry.external_data) == beside
    assert sorted(p.name for p in (manifest.parent / "ext" / "1").iterdir()) == sorted([*beside, "model.onnx"])
    answered = build_service(Settings(manifest=str(manifest))).predict("ext", {"input": DIGITS})
    np.testing.assert_array_equal(answered["label"], EXPECTED[0])


def test_a_tampered_data_file_answers_503_naming_it_while_the_other_models_answer(demo: Path, exported: Path) -> None:
    fnserve("manifest", "add", str(exported), "-n", "ext", "-m", str(demo))
    data_file = demo.parent / "ext" / "1" / "model.onnx.data"
    data_file.write_bytes(data_file.read_bytes()[::-1])
    settings = Settings(manifest=str(demo), access_log=False)
    client = AsgiClient(create_app(build_dataplane(settings), settings))
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}]}
    refused = client.post("/v2/models/ext/infer", json=body)
    assert refused.status_code == 503, refused.text
    assert f"file {data_file} has sha256" in refused.json()["error"]
    answered = client.post("/v2/models/digits-accurate/infer", json=body)
    assert answered.status_code == 200, answered.text
    assert answered.json()["outputs"][0]["data"] == EXPECTED[0][:1].tolist()


@pytest.mark.parametrize("folder_there", [False, True], ids=["new-folder", "folder-there"])
def test_an_add_refused_after_the_copies_leaves_none_of_them(demo: Path, exported: Path, folder_there: bool) -> None:
    if folder_there:
        (demo.parent / "digits" / "1").mkdir(parents=True)
    before = sorted(demo.parent.rglob("*"))
    text = demo.read_text()
    assert "already a model's" in refused("manifest", "add", str(exported), "-n", "digits", "-m", str(demo))
    assert demo.read_text() == text and sorted(demo.parent.rglob("*")) == before


def test_without_onnx_add_says_what_to_install_for_a_graph_with_data_files(tmp_path: Path, exported: Path) -> None:
    """The onnx package lists a graph's data files; without it, a graph that loads from its own bytes is added, and
    one that does not is refused with what to install (the import made to fail as a missing package's does)."""
    script = (
        "import sys; sys.modules['onnx'] = None\n"
        "from pathlib import Path\n"
        "from fnserve.core.errors import ConfigError\n"
        "from fnserve.core.models.writing import add_model\n"
        "manifest = Path(sys.argv[1])\n"
        "print(add_model(manifest, Path(sys.argv[2]), 'plain').entry['name'])\n"
        "try:\n"
        "    add_model(manifest, Path(sys.argv[3]), 'ext')\n"
        "except ConfigError as exc:\n"
        "    print(exc.message)\n"
    )
    manifest = tmp_path / "manifest.toml"
    done = subprocess.run(
        [sys.executable, "-c", script, str(manifest), str(ACCURATE), str(exported)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.splitlines() == [
        "plain",
        f"{exported} keeps tensors in files beside it, which only the onnx package can list: "
        '.venv/bin/pip install ".[quantize]" in the checkout, or the wheel with [quantize] (docs/install.md)',
    ]
    assert [m.name for m in load_manifest(manifest).models] == ["plain"]


def test_push_uploads_data_files_beside_their_model_and_the_bucket_serves_it(
    aws: Aws, tmp_path: Path, exported: Path
) -> None:
    manifest = tmp_path / "models" / "manifest.toml"
    manifest.parent.mkdir()
    fnserve("manifest", "add", str(exported), "-n", "ext", "-m", str(manifest))
    destination = f"s3://{aws.bucket}/big"
    output = fnserve("models", "push", destination, "-m", str(manifest))
    assert f"uploaded   {destination}/ext/1/model.onnx.data" in output
    s3 = clients.client("s3")
    stored = s3.get_object(Bucket=aws.bucket, Key="big/ext/1/model.onnx.data")["Body"].read()
    assert stored == (exported.parent / "model.onnx.data").read_bytes()

    service = build_service(Settings(manifest=f"{destination}/manifest.toml", model_cache_dir=tmp_path / "cache"))
    answered = service.predict("ext", {"input": DIGITS})
    np.testing.assert_array_equal(answered["label"], EXPECTED[0])
    assert (tmp_path / "cache" / "ext" / "1" / "model.onnx.data").read_bytes() == stored

    again = fnserve("models", "push", destination, "-m", str(manifest))
    assert again.count("uploaded") == 1 and f"unchanged  {destination}/ext/1/model.onnx.data" in again
    # A data file that is not what the manifest says stops the push before anything is sent.
    (manifest.parent / "ext" / "1" / "model.onnx.data").write_bytes(b"other weights")
    elsewhere = f"s3://{aws.bucket}/other"
    assert "model.onnx.data has sha256" in refused("models", "push", elsewhere, "-m", str(manifest))
    assert "Contents" not in s3.list_objects_v2(Bucket=aws.bucket, Prefix="other/")


def test_add_with_a_tokenizer_writes_the_text_pipeline_and_serves_the_demos_embeddings(tmp_path: Path) -> None:
    """The demo's MiniLM and its tokenizer added from outside any manifest: the same vectors as the demo's
    hand-written minilm-embed pipeline, on V2 and OpenAI's embeddings API; a second version keeps the pipeline."""
    from fnserve.core.execution.service import InferenceService
    from tests.embeddings import SENTENCES

    manifest = tmp_path / "my-models" / "manifest.toml"
    minilm = MODELS / "minilm-l6"
    said = fnserve(
        "manifest", "add", str(minilm / "1" / "model.onnx"), "--name", "my-embedder", "-m", str(manifest),
        "--tokenizer", str(minilm / "tokenizer.json"), "--max-length", "256",
    )  # fmt: skip
    assert "added my-embedder-onnx version 1" in said and "added pipeline my-embedder: text in" in said, said
    assert (manifest.parent / "my-embedder" / "tokenizer.json").read_bytes() == (minilm / "tokenizer.json").read_bytes()
    loaded = load_manifest(manifest)
    [model], [pipeline] = loaded.models, loaded.pipelines
    assert model.length_buckets == [16, 32, 64, 128, 256] and model.max_batch_tokens == 1024
    assert pipeline.model == "my-embedder-onnx" and pipeline.post[0].mode == "mean"  # type: ignore[union-attr]
    texts = np.array(SENTENCES[:12], dtype=object)
    mine = InferenceService.from_manifest(manifest).predict("my-embedder", {"text": texts})["embedding"]
    theirs = InferenceService.from_manifest(DEMO_MANIFEST).predict("minilm-embed", {"text": texts})["embedding"]
    np.testing.assert_allclose(mine, theirs, atol=1e-6)
    settings = Settings(manifest=str(manifest))
    client = AsgiClient(create_app(build_dataplane(settings), settings))
    answer = client.post("/v1/embeddings", json={"model": "my-embedder", "input": SENTENCES[:2]})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], theirs[:2], atol=1e-5)

    again = fnserve(
        "manifest", "add", str(minilm / "1" / "model.onnx"), "--name", "my-embedder", "-m", str(manifest),
        "--tokenizer", str(minilm / "tokenizer.json"),
    )  # fmt: skip
    assert "added my-embedder-onnx version 2" in again and "pipeline my-embedder kept" in again, again
    assert len(load_manifest(manifest).pipelines) == 1


def test_add_with_a_tokenizer_refuses_a_graph_that_is_no_text_encoder_and_writes_nothing(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    tokenizer = MODELS / "minilm-l6" / "tokenizer.json"
    said = refused(
        "manifest", "add", str(ACCURATE), "--name", "digits", "-m", str(manifest), "--tokenizer", str(tokenizer)
    )
    assert "takes no input_ids" in said and "not a text encoder" in said, said
    reranker = MODELS / "minilm-rerank" / "1" / "model.onnx"  # text in, but one logit a pair out
    said = refused("manifest", "add", str(reranker), "--name", "rr", "-m", str(manifest), "--tokenizer", str(tokenizer))
    assert "no token embeddings output" in said and "fnserve import" in said, said
    assert not manifest.exists() and list(tmp_path.iterdir()) == []
