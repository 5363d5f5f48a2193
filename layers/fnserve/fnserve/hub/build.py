"""A read folder made servable: its ONNX graph (shipped, or exported by optimum), int8 where that keeps its answers
and is not slower, and its model and pipeline appended to a manifest.

Everything is made in a staging folder beside the manifest and checked there by serving it: the float pipeline's
outputs on sample texts, then the int8 one's against them, each through the same steps a server runs. Only then
do the files move into place and the manifest gain its entries (validated as a whole first), so a refusal leaves
both as they were.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w

from fnserve.core.errors import ConfigError, FnserveError
from fnserve.core.models.writing import text_model_fields, token_embeddings
from fnserve.hub.folder import Folder

Precision = Literal["auto", "int8", "float"]
# int8 is kept when it is this close to the float model on the sample texts (else the float model is).
EMBED_COSINE = 0.99  # every text's embedding, cosine to the float one's
SCORE_ATOL = 0.05  # every probability or relevance score
RERANK_DOCUMENTS = 4  # a reranker's sample: each query's documents, whose best must stay its best
SAMPLES = Path(__file__).with_name("samples.txt")
EXPORT_PYTHON = "FNSERVE_EXPORT_PYTHON"


@dataclass
class Imported:
    """What an import wrote, and what it found on the way (``lines``, printed as they come)."""

    pipeline: str
    model: str
    kind: str
    precision: str
    inputs: list[str]
    lines: list[str] = field(default_factory=list)


def sample_texts(path: Path | None) -> list[str]:
    """The texts the models are checked on: a file's lines, or the package's own sentences."""
    lines = (path or SAMPLES).read_text(encoding="utf-8").splitlines()
    texts = [line.strip() for line in lines if line.strip()]
    if len(texts) < 8:
        raise ConfigError(f"{path}: at least 8 sample texts are needed, one a line")
    return texts


def sample_inputs(folder: Folder, texts: list[str]) -> dict[str, np.ndarray[Any, Any]]:
    """The pipeline's inputs for the check: the texts, or for a reranker queries (a text's first words) each against
    its own text and three others."""
    if folder.kind != "rerank":
        return {"text": np.array(texts, dtype=object)}
    queries = len(texts) // RERANK_DOCUMENTS
    pairs = [(q, q + d * queries) for q in range(queries) for d in range(RERANK_DOCUMENTS)]
    return {
        "query": np.array([" ".join(texts[q].split()[:6]) for q, _ in pairs], dtype=object),
        "document": np.array([texts[d] for _, d in pairs], dtype=object),
    }


def export_python(given: str | None) -> str:
    """The interpreter with optimum's exporter (and torch): given, from FNSERVE_EXPORT_PYTHON, or this one."""
    chosen = given or os.environ.get(EXPORT_PYTHON)
    if chosen:
        return chosen
    if importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("torch") is not None:
        return sys.executable
    raise ConfigError(
        "the folder ships no ONNX file, and exporting one needs optimum's exporter and torch, which the runtime never "
        "installs: make an export environment (python -m venv .venv-export && .venv-export/bin/pip install "
        f"optimum-onnx torch) and pass --export-python .venv-export/bin/python (or set {EXPORT_PYTHON})"
    )


def export(folder: Folder, out: Path, python: str) -> Path:
    """The folder's model exported to ONNX by optimum (its inputs and dynamic axes are optimum's, by architecture)."""
    command = [python, "-m", "optimum.exporters.onnx", "--model", str(folder.path), "--task", folder.task]
    # The encoder's token embeddings, not sentence-transformers' pooled graph: fnserve pools in its own step.
    command += ["--library-name", "transformers", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    graph = out / "model.onnx"
    if done.returncode != 0 or not graph.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise ConfigError(f"optimum could not export {folder.architecture} ({folder.path}) to ONNX:\n{tail}")
    return graph


def entries(folder: Folder, name: str, model_path: str, graph: Any) -> dict[str, Any]:
    """The manifest's model and pipeline tables for ``folder`` (``graph``: an onnxruntime session on its model)."""
    inputs = [arg.name for arg in graph.get_inputs()]
    outputs = {arg.name: len(arg.shape) for arg in graph.get_outputs()}
    if "input_ids" not in inputs:
        raise ConfigError(f"the model of {folder.path} takes no input_ids (it takes {inputs}): not a text model")
    length = folder.max_length
    model: dict[str, Any] = {
        "name": f"{name}-onnx",
        "path": model_path,
        "sha256": "0" * 64,  # the caller writes the file's own
        "description": f"{folder.architecture} from {folder.path.name}, imported by fnserve import",
        **text_model_fields(inputs, length),
    }
    tokenize: dict[str, Any] = {"step": "tokenize", "tokenizer": f"{name}/tokenizer.json", "max_length": length}
    pipeline: dict[str, Any] = {"name": name, "model": model["name"], "pre": [tokenize]}
    if folder.kind == "embed":
        pipeline["description"] = f"text in; its {folder.pooling}-pooled embedding out"
        if folder.prompts:
            tokenize["prompts"] = folder.prompts
            if folder.default_prompt is not None:
                tokenize["default_prompt"] = folder.default_prompt
        tokens = token_embeddings(outputs)
        if tokens is None:
            raise ConfigError(f"the model of {folder.path} has no token embeddings output ([rows, tokens, dim])")
        pool = {"step": "pool", "mode": folder.pooling, "input": tokens, "normalize": folder.normalize}
        pipeline["post"] = [pool]
        if folder.dimensions:
            pipeline["embedding"] = {"dimensions": folder.dimensions}
    else:
        if outputs.get("logits") != 2:
            raise ConfigError(f"the model of {folder.path} has no logits output ([rows, labels]): {sorted(outputs)}")
        if folder.kind == "rerank":
            tokenize.update(input="query", pair="document")
            pipeline["description"] = "a query and a document in; their relevance score (sigmoid of the logit) out"
            if folder.sigmoid:
                pipeline["post"] = [{"step": "sigmoid", "input": "logits", "output": "score"}]
                pipeline["outputs"] = ["score", "logits"]
            else:  # its own scores are the raw logits (activation_fn Identity)
                pipeline["outputs"] = ["logits"]
        else:
            activation = "sigmoid" if folder.multi_label else "softmax"
            pipeline["description"] = f"text in; its labels by {activation} probability out"
            pipeline["post"] = [
                {"step": activation, "input": "logits", "output": "probabilities"},
                {"step": "topk", "input": "probabilities", "k": len(folder.labels), "labels": f"{name}/labels.txt"},
            ]
            pipeline["outputs"] = ["labels", "scores", "probabilities", "logits"]  # logits: TEI's raw_scores
    return {"models": [model], "pipelines": [pipeline]}


def agreement(kind: str, reference: dict[str, Any], candidate: dict[str, Any]) -> tuple[bool, str]:
    """Whether the candidate's answers keep to the bound against the reference's, and the figures that say so."""
    if kind == "embed":
        a, b = reference["embedding"], candidate["embedding"]
        cosine = np.sum(a * b, axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
        worst = float(cosine.min())
        return worst >= EMBED_COSINE, (
            f"cosine to the float model's embeddings: mean {float(cosine.mean()):.5f}, worst {worst:.5f} "
            f"(bound: worst >= {EMBED_COSINE})"
        )
    name = ("score" if "score" in reference else "logits") if kind == "rerank" else "probabilities"
    a, b = reference[name], candidate[name]
    diff = float(np.max(np.abs(a - b)))
    if kind == "rerank":  # rows are queries' documents, RERANK_DOCUMENTS a query
        a, b = a.reshape(-1, RERANK_DOCUMENTS), b.reshape(-1, RERANK_DOCUMENTS)
        what, best = "each query's best document", "best document the same"
    else:
        what, best = "every text's top label", "top label the same"
    same = float(np.mean(a.argmax(1) == b.argmax(1)))
    return diff <= SCORE_ATOL and same == 1.0, (
        f"largest {name} difference to the float model {diff:.4f}, {best} for {same:.0%} "
        f"(bound: <= {SCORE_ATOL}, {what} kept)"
    )


def serve_outputs(manifest: Path, name: str, inputs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The pipeline's answers on ``inputs`` as a server computes them, and its model's feed for them."""
    from fnserve.core.execution.service import InferenceService

    service = InferenceService.from_manifest(manifest)
    servable = service.servable(name)
    feed, _ = servable.validate(inputs)
    staged = servable.pipeline.stage(feed)  # type: ignore[attr-defined]
    return service.predict(name, inputs), staged.feed


PROTOBUF_LIMIT = 2**31 - 1  # the most bytes one ONNX file can hold: past it, tensors must live beside the graph


def one_file(graph: Path, target: Path, say: Callable[[str], None]) -> None:
    """``graph`` copied to ``target`` as one file: its external data files (``model.onnx_data``), where it keeps
    tensors in them, read back in, so that quantizing, optimising and serving it see one graph."""
    from fnserve.core.models.external import graph_files

    files = graph_files(graph)
    if not files:
        shutil.copyfile(graph, target)
        return
    import onnx

    size = graph.stat().st_size + sum((graph.parent / name).stat().st_size for name in files)
    if size > PROTOBUF_LIMIT:
        raise ConfigError(
            f"{graph} keeps {size / 1e9:.1f} GB of tensors in {', '.join(files)}, past the 2 GB one ONNX file holds: "
            "add the graph as it is with fnserve manifest add, which keeps its data files"
        )
    say(f"ONNX: its tensors read in from {', '.join(files)}")
    onnx.save_model(onnx.load(str(graph)), str(target))


def write_manifest(staging: Path, tables: dict[str, Any], model: Path) -> Path:
    from fnserve.core.models.writing import HEADER, file_sha256

    tables["models"][0]["sha256"] = file_sha256(model)
    path = staging / "manifest.toml"
    path.write_text(HEADER + tomli_w.dumps(tables), encoding="utf-8")
    return path


def import_folder(
    folder: Folder,
    manifest: Path,
    name: str,
    *,
    precision: Precision = "auto",
    python: str | None = None,
    texts: list[str] | None = None,
    say: Callable[[str], None] = print,
) -> Imported:
    """Make ``folder`` servable as the pipeline ``name`` of ``manifest`` (created if missing)."""
    from fnserve.core.models.writing import manifest_text, parse

    existing = manifest_text(manifest) if manifest.exists() else ""
    current = parse(existing, manifest) if existing else {}
    taken = {str(e.get("name")) for key in ("models", "pipelines", "cascades") for e in current.get(key, [])}
    for wanted in (name, f"{name}-onnx"):
        if wanted in taken:
            raise ConfigError(f"{manifest} already serves {wanted!r}: give the import another --name")
    root = manifest.resolve().parent
    if (root / name).exists():
        raise ConfigError(f"{root / name} exists: remove it, or give the import another --name")
    staging = root / f".import-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        imported = _staged(folder, staging, name, precision, python, texts or sample_texts(None), say)
        _land(staging, root, name, manifest, existing)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return imported


def _staged(
    folder: Folder,
    staging: Path,
    name: str,
    precision: Precision,
    python: str | None,
    texts: list[str],
    say: Callable[[str], None],
) -> Imported:
    from fnserve import quantize as q
    from fnserve.optimize import optimize
    from fnserve.per_token import applies

    files = staging / name
    (files / "1").mkdir(parents=True)
    shutil.copyfile(folder.path / "tokenizer.json", files / "tokenizer.json")
    if folder.labels:
        (files / "labels.txt").write_text("\n".join(folder.labels) + "\n", encoding="utf-8")
    float_graph = files / "float.onnx"
    if folder.onnx is not None:
        say(f"ONNX: {folder.onnx.relative_to(folder.path)}, as the folder ships it")
        one_file(folder.onnx, float_graph, say)
    else:
        chosen = export_python(python)
        say(f"ONNX: exporting with optimum ({chosen}), task {folder.task}")
        shutil.move(export(folder, staging / "export", chosen), float_graph)
    tables = entries(folder, name, f"{name}/1/model.onnx", q.session(float_graph))
    inputs = sample_inputs(folder, texts)
    final = files / "1" / "model.onnx"
    optimize(float_graph, final)
    reference, feed = serve_outputs(write_manifest(staging, tables, final), name, inputs)
    kept = "float"
    if q.unquantized_ops(float_graph) is None:  # a folder's int8 file: its answers already what it ships
        say("int8: the folder's graph is quantized already; served as it ships")
        kept = "int8"
    elif precision != "float":
        import onnx

        if not applies(onnx.load(str(float_graph), load_external_data=False)):
            if precision == "int8":
                raise ConfigError(
                    f"{folder.architecture} is not a transformer fnserve quantizes per token; dynamic quantization "
                    "would make a text's answer depend on its batch: import it as float (--precision float)"
                )
            say("int8: not a transformer fnserve quantizes per token; kept float")
        else:
            kept = _int8(
                folder, files, float_graph, final, tables, staging, name, inputs, reference, feed, precision, say
            )
            if kept == "float" and precision == "int8":
                raise ConfigError("int8 is outside the bound above: import it as float (--precision float)")
    float_graph.unlink()
    write_manifest(staging, tables, final)
    return Imported(name, f"{name}-onnx", folder.kind, kept, list(inputs))


def _int8(
    folder: Folder,
    files: Path,
    float_graph: Path,
    final: Path,
    tables: dict[str, Any],
    staging: Path,
    name: str,
    inputs: dict[str, Any],
    reference: dict[str, Any],
    feed: dict[str, Any],
    precision: Precision,
    say: Callable[[str], None],
) -> str:
    """int8 per token in place of ``final`` where it keeps to the bound and, unless int8 was asked for, is not
    slower; which was kept."""
    from fnserve import quantize as q
    from fnserve.core.codec.datafiles import DataFile
    from fnserve.optimize import optimize

    sample = DataFile(dict(feed), None)
    quantized = files / "int8.onnx"
    q.quantize(float_graph, quantized, mode="per-token", calibration=sample)
    candidate = files / "int8-optimized.onnx"
    optimize(quantized, candidate)
    float_kept = files / "float-optimized.onnx"
    shutil.copyfile(final, float_kept)
    shutil.copyfile(candidate, final)
    answers, _ = serve_outputs(write_manifest(staging, tables, final), name, inputs)
    within, figures = agreement(folder.kind, reference, answers)
    say(f"int8 per token: {figures}")
    latency = q.measure_latency(q.session(float_kept), q.session(final), sample, 16, 30)
    say(f"int8 per token: {latency.after_ms:.1f} ms a batch of 16 against float's {latency.before_ms:.1f} ms")
    for path in (quantized, candidate):
        path.unlink()
    if within and (precision == "int8" or not latency.slower):
        float_kept.unlink()
        return "int8"
    say("int8: " + ("outside the bound" if not within else "slower") + "; kept the float model")
    shutil.move(float_kept, final)
    return "float"


def _land(staging: Path, root: Path, name: str, manifest: Path, existing: str) -> None:
    """The staged files moved into place and the manifest extended, or neither."""
    from fnserve.core.models.writing import HEADER, write_checked

    tables = (staging / "manifest.toml").read_text(encoding="utf-8").removeprefix(HEADER)
    shutil.move(staging / name, root / name)
    text = existing or HEADER
    separator = "" if text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    try:
        write_checked(manifest, text + separator + tables)
    except FnserveError:
        shutil.rmtree(root / name, ignore_errors=True)
        raise
