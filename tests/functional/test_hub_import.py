"""``fnserve import`` of the models teams bring from Hugging Face, served and compared with PyTorch's own answers.

The test models are small random-initialised models of real architectures (a BERT embedder with CLS pooling and a
query prompt, an XLM-RoBERTa with mean pooling, e5's prompts and its own ONNX file, a cross-encoder of one label, a
DistilBERT classifier of three), each laid out as the Hub lays it out, with sentence-transformers' and
transformers' outputs beside it: ``infra/models/make_hub_models.py`` makes them in the export environment
(``.venv-export``, torch and optimum; ``make test`` makes it). The shipped all-MiniLM-L6-v2 is imported too, as a
folder shipping its ONNX file, against sentence-transformers' embeddings of the demo sentences.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.embeddings import REFERENCE, SENTENCES, cosine
from tests.helpers import DEMO_MANIFEST, REPO, save_with_external_data
from tests.servers import start_server

EXPORT_PYTHON = REPO / ".venv-export" / "bin" / "python"
MODELS = {  # the folder make_hub_models.py writes -> the name it is imported as
    "bert-cls-query": "bge-test",
    "xlmr-mean-e5": "e5-test",
    "cross-encoder": "rerank-test",
    "distilbert-3labels": "sentiment-test",
}
FLOAT_COSINE = 0.9999  # the float model against PyTorch's


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not EXPORT_PYTHON.exists():
        pytest.fail("the export environment (torch, optimum) is missing: make .venv-export/.installed")
    out = tmp_path_factory.mktemp("hub")
    sentences = REPO / "tests" / "data" / "sentences.txt"
    script = REPO / "infra" / "models" / "make_hub_models.py"
    subprocess.run([str(EXPORT_PYTHON), str(script), str(out), "--sentences", str(sentences)], check=True)
    minilm = out / "all-minilm-l6-v2"  # the demo's real weights, as a Hub folder shipping its ONNX file
    (minilm / "onnx").mkdir(parents=True)
    (minilm / "1_Pooling").mkdir()
    shutil.copyfile(DEMO_MANIFEST.parent / "minilm-l6" / "1" / "model.onnx", minilm / "onnx" / "model.onnx")
    shutil.copyfile(DEMO_MANIFEST.parent / "minilm-l6" / "tokenizer.json", minilm / "tokenizer.json")
    files = {
        "config.json": {"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 512},
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
        "1_Pooling/config.json": {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True},
        "sentence_bert_config.json": {"max_seq_length": 256, "do_lower_case": False},
    }
    for name, content in files.items():
        (minilm / name).write_text(json.dumps(content))
    # The same folder with its graph's tensors in a file beside it, as exporters write graphs over 2 GB
    external = out / "all-minilm-l6-v2-external"
    shutil.copytree(minilm, external)
    save_with_external_data(external / "onnx" / "model.onnx", minilm / "onnx" / "model.onnx", "model.onnx_data")
    return out


def fnserve_import(folder: Path, manifest: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fnserve", "import", str(folder), "-m", str(manifest), *options]
    return subprocess.run([*command, "--export-python", str(EXPORT_PYTHON)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def imported(hub: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    manifest = tmp_path_factory.mktemp("served") / "manifest.toml"
    said: dict[str, str] = {}
    # Each as its import decides (tiny models run no faster in int8: float), and one held to int8 whatever its speed.
    runs = [*((folder, name, "auto") for folder, name in MODELS.items()), ("all-minilm-l6-v2", "minilm-test", "auto")]
    runs.append(("all-minilm-l6-v2-external", "minilm-external", "auto"))
    for folder, name, chosen in [*runs, ("bert-cls-query", "bge-int8", "int8")]:
        cut = ["--dimensions", "32,16"] if name == "e5-test" else []
        done = fnserve_import(hub / folder, manifest, "--name", name, "--precision", chosen, *cut)
        assert done.returncode == 0, done.stdout + done.stderr
        said[name] = done.stdout
    return manifest, said


@pytest.fixture(scope="module")
def server(imported: tuple[Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    manifest, _ = imported
    proc, url = start_server(["-m", str(manifest)], tmp_path_factory.mktemp("log") / "serve.log")
    yield url
    proc.terminate()
    proc.wait(10)


def precision(said: str) -> str:
    match = re.search(r"added model '[^']+' \((int8|float)\)", said)
    assert match, said
    return match.group(1)


def v2(url: str, name: str, inputs: dict[str, list[str]]) -> dict[str, np.ndarray]:
    body = {
        "inputs": [
            {"name": key, "shape": [len(values)], "datatype": "BYTES", "data": values} for key, values in inputs.items()
        ]
    }
    response = httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return {
        out["name"]: np.array(out["data"], dtype=object if out["datatype"] == "BYTES" else np.float32).reshape(
            out["shape"]
        )
        for out in response.json()["outputs"]
    }


def reference(hub: Path, folder: str) -> dict[str, np.ndarray]:
    return dict(np.load(hub / folder / "reference.npz"))


def embed_bound(said: str) -> float:
    """The cosine the import held its int8 model to, or the float model's own."""
    return 0.99 if precision(said) == "int8" else FLOAT_COSINE


def test_what_the_import_read_and_decided_is_said(imported: tuple[Path, dict[str, str]]) -> None:
    _, said = imported
    assert "BertModel (bert), served as embed" in said["bge-test"]
    assert "pooling cls, normalised: modules.json" in said["bge-test"]
    assert "query 'Represent this sentence for searching relevant passages: '" in said["bge-test"]
    assert "ONNX: exporting with optimum" in said["bge-test"]
    assert precision(said["bge-int8"]) == "int8"
    assert "ONNX: onnx/model.onnx, as the folder ships it" in said["e5-test"]
    assert "default passage" in said["e5-test"]
    assert "served as rerank" in said["rerank-test"]
    assert "quantized already; served as it ships" in said["minilm-test"]
    assert "labels negative, neutral, positive: config.json id2label" in said["sentiment-test"]
    for name, text in said.items():
        if precision(text) == "int8" and "quantized already" not in text:  # the shipped MiniLM's file is int8
            assert re.search(r"int8 per token: .*\(bound: ", text), text  # the bound it was held to, printed
        assert f"/v2/models/{name}/infer" in text


@pytest.mark.parametrize("name", ["bge-test", "e5-test", "bge-int8"])
def test_embedders_answer_as_sentence_transformers_with_their_prompts(
    hub: Path, server: str, imported: tuple[Path, dict[str, str]], name: str
) -> None:
    folder = {"bge-test": "bert-cls-query", "e5-test": "xlmr-mean-e5", "bge-int8": "bert-cls-query"}[name]
    ref = reference(hub, folder)
    texts = [str(t) for t in ref["texts"]]
    bound = embed_bound(imported[1][name])
    # V2 and the OpenAI route: a text with no prompt named gets the default one, as sentence-transformers gives it.
    assert cosine(v2(server, name, {"text": texts})["embedding"], ref["plain"]).min() >= bound
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    plain = client.embeddings.create(model=name, input=texts)
    got = np.array([d.embedding for d in plain.data], dtype=np.float32)
    assert cosine(got, ref["plain"]).min() >= bound
    prompts = [key.removeprefix("prompt_") for key in ref if key.startswith("prompt_")]
    assert prompts
    for prompt in prompts:
        answer = client.embeddings.create(model=name, input=texts, extra_body={"prompt_name": prompt})
        got = np.array([d.embedding for d in answer.data], dtype=np.float32)
        assert cosine(got, ref[f"prompt_{prompt}"]).min() >= bound, prompt
    if name == "e5-test":  # imported with its Matryoshka lengths: cut, then unit length again
        short = client.embeddings.create(model=name, input=texts, dimensions=16)
        got = np.array([d.embedding for d in short.data], dtype=np.float32)
        expected = ref["plain"][:, :16] / np.linalg.norm(ref["plain"][:, :16], axis=1, keepdims=True)
        assert cosine(got, expected).min() >= bound
    with pytest.raises(openai.BadRequestError, match="'nope' is not one of"):
        client.embeddings.create(model=name, input=texts[:1], extra_body={"prompt_name": "nope"})


def test_a_reranker_scores_and_orders_pairs_as_its_cross_encoder(
    hub: Path, server: str, imported: tuple[Path, dict[str, str]]
) -> None:
    ref = reference(hub, "cross-encoder")
    queries, documents = [str(q) for q in ref["queries"]], [str(d) for d in ref["documents"]]
    out = v2(server, "rerank-test", {"query": queries, "document": documents})
    score, expected = out["score"].reshape(-1), ref["scores"].reshape(-1)
    np.testing.assert_allclose(out["logits"].reshape(-1), ref["logits"].reshape(-1), atol=0.1)
    if precision(imported[1]["rerank-test"]) == "float":
        np.testing.assert_allclose(score, expected, atol=1e-4)
        assert np.argsort(-score).tolist() == np.argsort(-expected).tolist()
    else:
        np.testing.assert_allclose(score, expected, atol=0.02)


def test_a_classifier_names_its_labels_as_transformers_does(
    hub: Path, server: str, imported: tuple[Path, dict[str, str]]
) -> None:
    ref = reference(hub, "distilbert-3labels")
    texts = [str(t) for t in ref["texts"]]
    out = v2(server, "sentiment-test", {"text": texts})
    atol = 1e-4 if precision(imported[1]["sentiment-test"]) == "float" else 0.02
    np.testing.assert_allclose(out["probabilities"], ref["probabilities"], atol=atol)
    names = np.array(["negative", "neutral", "positive"])
    assert [label for label in out["labels"][:, 0]] == names[ref["probabilities"].argmax(1)].tolist()
    assert len(set(out["labels"][:, 0])) > 1  # the texts are not all one label: the order is a test


def test_the_shipped_minilm_imported_from_its_folder_is_the_demo(server: str) -> None:
    got = v2(server, "minilm-test", {"text": SENTENCES[:48]})["embedding"]
    similarity = cosine(got, REFERENCE[:48])
    assert similarity.mean() >= 0.998 and similarity.min() >= 0.985  # the demo's own per-token int8 bound


def test_a_folder_whose_graph_keeps_its_tensors_beside_it_serves_the_same_vectors(
    server: str, imported: tuple[Path, dict[str, str]]
) -> None:
    assert "its tensors read in from model.onnx_data" in imported[1]["minilm-external"]
    got = v2(server, "minilm-external", {"text": SENTENCES[:16]})["embedding"]
    np.testing.assert_array_equal(got, v2(server, "minilm-test", {"text": SENTENCES[:16]})["embedding"])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_folder_it_cannot_serve_is_refused_and_nothing_is_written(hub: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.toml"
    shutil.copyfile(DEMO_MANIFEST, manifest)
    before = digest(manifest)
    broken = tmp_path / "broken"
    shutil.copytree(hub / "bert-cls-query", broken)
    (broken / "tokenizer.json").unlink()
    cases = {"tokenizer.json is missing": broken}
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    shutil.copyfile(hub / "bert-cls-query" / "tokenizer.json", empty / "tokenizer.json")
    cases["holds no model"] = empty
    alien = tmp_path / "alien"
    shutil.copytree(hub / "cross-encoder", alien)
    config = json.loads((alien / "config.json").read_text())
    (alien / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    cases["optimum could not export"] = alien
    for message, folder in cases.items():
        done = fnserve_import(folder, manifest, "--name", "refused")
        assert done.returncode == 1, done.stdout
        assert message in done.stderr, done.stderr
        assert digest(manifest) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["manifest.toml", "broken", "empty", "alien"])
    taken = fnserve_import(hub / "bert-cls-query", manifest, "--name", "minilm-embed")
    assert taken.returncode == 1 and "already serves 'minilm-embed'" in taken.stderr
    assert digest(manifest) == before
