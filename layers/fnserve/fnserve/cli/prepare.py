"""``fnserve import``, ``fnserve quantize`` and ``fnserve optimize``: a model made ready for serving, each change
measured and checked."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from fnserve.cli.root import ManifestOpt, app, fail
from fnserve.core.errors import FnserveError
from fnserve.server.command import DEFAULT_MANIFEST

if TYPE_CHECKING:
    import onnxruntime as ort

    from fnserve.core.codec.datafiles import DataFile
    from fnserve.quantize import Mode, QuantizeReport


@app.command("import")
def import_model(
    folder: Annotated[
        Path, typer.Argument(help="A Hugging Face model folder (as the Hub lays it out: config.json, tokenizer.json).")
    ],
    name: Annotated[
        str | None, typer.Option(help="The name clients call it by; default: the folder's name, lower case.")
    ] = None,
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    kind: Annotated[
        str | None,
        typer.Option(
            help="embed, rerank or classify; default: what config.json says (a classifier of one label reranks)."
        ),
    ] = None,
    precision: Annotated[
        str,
        typer.Option(
            help="auto: int8 per token where it keeps to the bound on the sample texts and is not slower, else "
            "float; int8: refuse rather than keep float; float: never quantize."
        ),
    ] = "auto",
    export_python: Annotated[
        str | None,
        typer.Option(
            help="The Python with optimum and torch that exports a folder shipping no ONNX file (default: "
            "FNSERVE_EXPORT_PYTHON, else this one if it has them)."
        ),
    ] = None,
    texts: Annotated[
        Path | None, typer.Option(help="Sample texts to check the model on, one a line; default: fnserve's own.")
    ] = None,
    dimensions: Annotated[
        str | None,
        typer.Option(
            help="An embedder's Matryoshka lengths, comma-separated (64,128,256): what a request's dimensions may "
            "ask for; no file declares them."
        ),
    ] = None,
) -> None:
    """Serve a Hugging Face embedder, cross-encoder reranker or text classifier: its ONNX graph (shipped, or
    exported by optimum), int8 where that keeps its answers, and its model and pipeline added to the manifest."""
    from fnserve.hub.build import import_folder, sample_texts
    from fnserve.hub.folder import read_folder

    if kind not in (None, "embed", "rerank", "classify"):
        raise fail(f"--kind must be embed, rerank or classify, not {kind!r}")
    if precision not in ("auto", "int8", "float"):
        raise fail(f"--precision must be auto, int8 or float, not {precision!r}")
    chosen = name or folder.resolve().name.lower()
    try:
        found = read_folder(folder, kind)  # type: ignore[arg-type]
        if dimensions:
            if found.kind != "embed" or not all(d.strip().isdigit() and int(d) > 0 for d in dimensions.split(",")):
                raise fail("--dimensions: positive lengths, comma-separated, for an embedder")
            found.dimensions = sorted({int(d) for d in dimensions.split(",")})
        typer.echo(f"{folder}: {found.architecture} ({found.model_type}), served as {found.kind}")
        for note in found.notes:
            typer.echo(f"  {note}")
        if found.labels:
            typer.echo(f"  labels {', '.join(found.labels)}: config.json id2label")
        imported = import_folder(
            found,
            manifest,
            chosen,
            precision=precision,  # type: ignore[arg-type]
            python=export_python,
            texts=sample_texts(texts) if texts else None,
            say=lambda line: typer.echo(f"  {line}"),
        )
    except FnserveError as exc:
        raise fail(exc.message) from None
    typer.echo(
        f"added model {imported.model!r} ({imported.precision}) and pipeline {imported.pipeline!r} to {manifest}"
    )
    body = {
        "embed": '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a sentence"]}]}',
        "rerank": '{"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["a question"]}, '
        '{"name": "document", "shape": [1], "datatype": "BYTES", "data": ["a passage"]}]}',
        "classify": '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a sentence"]}]}',
    }[imported.kind]
    typer.echo(f"serve it: fnserve serve -m {manifest}, then")
    typer.echo(f"  curl -s localhost:8080/v2/models/{imported.pipeline}/infer -d '{body}'")
    if imported.kind == "embed":
        body = f'{{"model": "{imported.pipeline}", "input": ["a sentence"]}}'
        typer.echo(f"  curl -s localhost:8080/v1/embeddings -d '{body}'")


@app.command()
def quantize(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="ONNX model to quantize.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the quantized model.")],
    mode: Annotated[
        str,
        typer.Option(
            help="per-token (each row's activations by its own range: a row's answer never depends on its batch), "
            "dynamic (one range a batch: onnxruntime's), static (ranges fixed by calibration); "
            "auto: per-token for a transformer, dynamic otherwise."
        ),
    ] = "auto",
    per_channel: Annotated[
        bool, typer.Option("--per-channel", help="Per-channel weight scales (dynamic and static; per-token always is).")
    ] = False,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="Calibration inputs (.npy/.npz); required for static; per-token uses them, else --validation."
        ),
    ] = None,
    validation: Annotated[
        Path | None, typer.Option(help="Validation inputs (.npz, labels optional) for accuracy/agreement.")
    ] = None,
    rounds: Annotated[int, typer.Option(min=10, help="Timed rounds per batch size.")] = 200,
    threads: Annotated[int | None, typer.Option(min=1, help="Intra-op threads while timing.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write the model even if it came out slower.")] = False,
) -> None:
    """Quantize a model to int8 and report size, latency and accuracy before and after."""
    from fnserve import quantize as q
    from fnserve.core.codec.datafiles import read_data

    if mode not in (*q.MODES, "auto"):
        raise fail(f"--mode must be auto, {', '.join(q.MODES)}, not {mode!r}")
    if mode == "static" and calibration is None:
        raise fail("static quantization needs --calibration")
    before = q.session(model, threads)
    names = [arg.name for arg in before.get_inputs()]
    try:
        calib = read_data(calibration, names) if calibration else None
        valid = read_data(validation, names) if validation else None
    except FnserveError as exc:
        raise fail(exc.message) from None
    if mode == "auto":
        mode = q.auto_mode(model)
    if mode == "per-token" and calib is None:
        calib = valid  # its ranges and activations: what zero points, smoothing and rounding are fitted to
    sample = valid or calib or q.synthetic_inputs(before)
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp) / "quantized.onnx"
        report = _quantize_and_compare(
            model, candidate, cast(q.Mode, mode), per_channel, calib, valid, sample, rounds, threads, before
        )
        for line in report.lines():
            typer.echo(line)
        slower = report.slower_at()
        if slower and not force:
            raise fail(
                f"the quantized model is confidently slower at batch {', '.join(map(str, slower))} (see above); "
                f"not writing {output} (use --force to write it anyway)"
            )
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(candidate, output)
    from fnserve.core.models.writing import file_sha256

    typer.echo(f"wrote {output} (sha256 {file_sha256(output)}: the manifest's sha256 for it)")


@app.command()
def optimize(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="ONNX model to optimise.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the optimised model.")],
    level: Annotated[str, typer.Option(help="basic or extended (the levels that suit any CPU).")] = "extended",
    validation: Annotated[
        Path | None, typer.Option(help="Inputs (.npz) to compare the outputs on (default: random ones).")
    ] = None,
    rounds: Annotated[int, typer.Option(min=10, help="Timed rounds per batch size.")] = 100,
    starts: Annotated[int, typer.Option(min=3, help="Sessions created on each, for their creation time.")] = 11,
    threads: Annotated[int | None, typer.Option(min=1, help="Intra-op threads while timing.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write the model even if it came out slower or answering otherwise.")
    ] = False,
) -> None:
    """Optimise a model's graph once, so that every start creates its session sooner; its answers are checked equal."""
    from fnserve import optimize as o
    from fnserve import quantize as q
    from fnserve.core.codec.datafiles import read_data

    if level not in o.LEVELS:
        raise fail(f"--level must be basic or extended, not {level!r} (all adds layouts for this machine's CPU)")
    before = q.session(model, threads)
    try:
        sample = read_data(validation, [a.name for a in before.get_inputs()]) if validation else None
    except FnserveError as exc:
        raise fail(exc.message) from None
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp) / "optimized.onnx"
        report = o.optimize_and_compare(
            before, model, candidate, level, sample or q.synthetic_inputs(before), rounds, starts, threads
        )
        for line in report.lines():
            typer.echo(line)
        refused = [f"its output(s) {', '.join(report.unequal)} differ"] if report.unequal else []
        if slower := report.slower_at():
            refused.append(f"it is confidently slower at batch {', '.join(map(str, slower))}")
        if refused and not force:
            raise fail(f"{' and '.join(refused)} (see above); not writing {output} (use --force to write it anyway)")
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(candidate, output)
    from fnserve.core.models.writing import file_sha256

    typer.echo(f"wrote {output} (sha256 {file_sha256(output)}: the manifest's sha256 for it)")


def _quantize_and_compare(
    model: Path,
    candidate: Path,
    mode: Mode,
    per_channel: bool,
    calib: DataFile | None,
    valid: DataFile | None,
    sample: DataFile,
    rounds: int,
    threads: int | None,
    before: ort.InferenceSession,
) -> QuantizeReport:
    """Quantize ``model`` to ``candidate``, then time both (batch 1 and 64) and compare their outputs."""
    from rich.progress import Progress

    from fnserve import quantize as q

    with Progress(transient=True) as progress:
        step = progress.add_task(f"{mode} quantization", total=None)
        q.quantize(model, candidate, mode=mode, per_channel=per_channel, calibration=calib)
        progress.update(step, total=1, completed=1)
        after = q.session(candidate, threads)
        report = q.QuantizeReport(
            mode=mode + ("" if mode == "per-token" else " per-channel" if per_channel else " per-tensor"),
            size_before=q.file_size(model),
            size_after=q.file_size(candidate),
            unquantized_ops=q.unquantized_ops(candidate),
        )
        for batch in (1, 64):
            task = progress.add_task(f"timing batch {batch}", total=rounds)
            report.latencies.append(
                q.measure_latency(before, after, sample, batch, rounds, functools.partial(progress.advance, task))
            )
        if valid is not None:
            q.compare_outputs(before, after, valid, report)
        if sample.rows > 1:  # a batch of one proves nothing
            report.drift_rows, report.drift_batch = min(8, sample.rows), min(64, sample.rows)
            report.batch_drift = (q.batch_drift(before, sample), q.batch_drift(after, sample))
    return report
