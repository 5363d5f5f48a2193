"""``fnserve models`` (what a manifest serves; ``push`` to a bucket), ``fnserve manifest add`` and ``fnserve
predict``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fnserve.cli.root import ManifestOpt, app, fail, manifest_app, models_app
from fnserve.core.errors import FnserveError
from fnserve.server.command import DEFAULT_MANIFEST


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context, manifest: ManifestOpt = DEFAULT_MANIFEST) -> None:
    """List what a manifest serves: its models (inputs and outputs), its pipelines and its cascades."""
    if ctx.invoked_subcommand is not None:
        return
    from fnserve.core.execution.service import InferenceService

    try:
        service = InferenceService.from_manifest(manifest)
        for name in service.registry.names():
            meta = service.model_metadata(name)
            group = service.registry.manifest.group_of(name)
            placed = f"  in worker group {group.name!r} ({group.workers} worker(s))" if group is not None else ""
            typer.echo(f"{name}  versions {', '.join(meta['versions'])}{placed}")
            echo_tensors(meta)
        for pipeline in service.registry.manifest.pipelines:
            steps = " -> ".join([*(s.step for s in pipeline.pre), pipeline.model, *(s.step for s in pipeline.post)])
            typer.echo(f"{pipeline.name}  pipeline: {steps}")
            echo_tensors(service.model_metadata(pipeline.name))
        for cascade in service.registry.manifest.cascades:
            rule = f"{cascade.rule} of {cascade.output!r} ({cascade.scores}) >= {cascade.threshold:g}"
            typer.echo(f"{cascade.name}  cascade: {cascade.fast} at once, {cascade.slow} follows up unless {rule}")
            echo_tensors(service.model_metadata(cascade.fast, cascade.fast_version))
    except FnserveError as exc:
        raise fail(exc.message) from None


def echo_tensors(meta: dict[str, Any]) -> None:
    for kind in ("inputs", "outputs"):
        for spec in meta[kind]:
            typer.echo(f"    {kind[:-1]:<6} {spec['name']:<16} {spec['datatype']:<6} {spec['shape']}")


@models_app.command("push")
def models_push(
    destination: Annotated[
        str,
        typer.Argument(
            help="A bucket, and a prefix in it if you like: s3://bucket, s3://bucket/prefix, gs://bucket/prefix."
        ),
    ],
    manifest: ManifestOpt = DEFAULT_MANIFEST,
) -> None:
    """Upload a manifest's models and step files to a bucket, and a manifest there naming them by URI.

    Files already there with the same sha256 are not sent again. Serve it with FNSERVE_MANIFEST set to
    the printed URI (on SAM: the ModelBucket and ModelManifestKey parameters).
    """
    from fnserve.stores.manifests import push

    try:
        pushed = push(manifest, destination)
    except FnserveError as exc:
        raise fail(exc.message) from None
    for uri in pushed.uploaded:
        typer.echo(f"uploaded   {uri}")
    for uri in pushed.unchanged:
        typer.echo(f"unchanged  {uri}")
    bucket, _, key = pushed.manifest_uri.partition("://")[2].partition("/")
    typer.echo(f"\nserve it with FNSERVE_MANIFEST={pushed.manifest_uri}")
    if pushed.manifest_uri.startswith("s3://"):
        overrides = f"ModelBucket={bucket} ModelManifestKey={key}"
        typer.echo(f"or deploy: make deploy SAM_DEPLOY_ARGS='--parameter-overrides {overrides}'")


@manifest_app.command("add")
def manifest_add(
    model: Annotated[Path, typer.Argument(help="The ONNX file.")],
    name: Annotated[str, typer.Option("--name", "-n", help="The name it is served under.")],
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    version: Annotated[
        str | None, typer.Option(help="Its version (default: one above the name's highest, else 1).")
    ] = None,
    description: Annotated[str | None, typer.Option(help="A line saying what it is.")] = None,
    max_batch_size: Annotated[int | None, typer.Option(min=1, help="Bigger batches run in chunks of this.")] = None,
    copy: Annotated[
        bool,
        typer.Option(
            "--copy/--no-copy",
            help="Copy a file from outside the manifest's folder to NAME/VERSION/model.onnx beside it "
            "(--no-copy: name it by its absolute path).",
        ),
    ] = True,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="A text encoder's tokenizer.json: the model is added as NAME-onnx, batched by tokens, and the "
            "pipeline NAME takes text and answers its embedding (V2 and /v1/embeddings).",
        ),
    ] = None,
    pooling: Annotated[str, typer.Option(help="--tokenizer: mean, cls, max or last_token.")] = "mean",
    max_length: Annotated[
        int, typer.Option(min=2, help="--tokenizer: longer texts are cut to this many tokens.")
    ] = 512,
    normalize: Annotated[
        bool, typer.Option("--normalize/--no-normalize", help="--tokenizer: embeddings scaled to unit length.")
    ] = True,
) -> None:
    """Add a model to a manifest (created if missing): its sha256 computed, its graph loaded and shown; with
    --tokenizer, the text pipeline around it too."""
    from fnserve.core.models.writing import add_model

    try:
        added = add_model(
            manifest,
            model,
            name,
            version=version,
            description=description,
            max_batch_size=max_batch_size,
            copy=copy,
            tokenizer=tokenizer,
            pooling=pooling,
            max_length=max_length,
            normalize=normalize,
        )
    except FnserveError as exc:
        raise fail(exc.message) from None
    if added.copied:
        typer.echo(f"copied {model} to {added.model_file}")
        for name in added.data_files:  # where its graph looks for them: by their names, beside it
            typer.echo(f"copied {model.parent / name} to {added.model_file.parent / name}")
    entry = added.entry
    typer.echo(f"added {entry['name']} version {entry['version']} to {manifest} (sha256 {entry['sha256']})")
    inputs, outputs = ([s.to_metadata() for s in specs] for specs in (added.inputs, added.outputs))
    echo_tensors({"inputs": inputs, "outputs": outputs})
    if added.pipeline is not None:
        pipe = added.pipeline["name"]
        typer.echo(
            f"added pipeline {pipe}: {added.pipeline['description']}; call it on /v2/models/{pipe}/infer "
            f'(input "text") or /v1/embeddings (model "{pipe}")'
        )
    elif tokenizer is not None:
        typer.echo(f"pipeline {name} kept: it serves the latest version of {added.entry['name']}")


@app.command()
def predict(
    model: Annotated[str, typer.Argument(help="Model name.")],
    data: Annotated[Path, typer.Argument(help=".npy or .npz inputs (an .npz may carry labels).")],
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    version: Annotated[str | None, typer.Option(help="Model version (default: latest).")] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="Rows to predict.")] = 10,
) -> None:
    """Predict the first rows of a data file; print predictions beside the true labels.

    A cascade answers each row as its own request would once its follow-up is done: the fast
    model's answer where it is confident, the slow model's elsewhere."""
    from fnserve.core.codec.datafiles import read_data
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.jobs.cascade import settle

    try:
        service = InferenceService.from_manifest(manifest)
        cascade = next((c for c in service.registry.manifest.cascades if c.name == model), None)
        if cascade is not None and version is not None:
            raise fail(f"cascade {model!r} has no versions")
        meta = service.model_metadata(cascade.fast if cascade else model, cascade.fast_version if cascade else version)
        rows = read_data(data, [spec["name"] for spec in meta["inputs"]]).head(count)
        if cascade is None:
            outputs = service.predict(model, rows.inputs, version=version)
            typer.echo(f"{model} (version {version or meta['versions'][-1]}), {rows.rows} rows:")
        else:
            outputs, slow = settle(service, cascade, rows.inputs)
            typer.echo(
                f"{model} (cascade: {cascade.fast} answered {int((~slow).sum())} rows, "
                f"{cascade.slow} followed up on {int(slow.sum())}), {rows.rows} rows:"
            )
    except FnserveError as exc:
        raise fail(exc.message) from None
    import numpy as np  # here: every command's start (a server's front processes' too) imports this module

    predicted = _predicted_labels(outputs)
    if predicted is None or rows.labels is None:
        for name, value in outputs.items():
            typer.echo(f"  {name}: {np.array2string(value, threshold=50)}")
        return
    for i, (got, want) in enumerate(zip(predicted, rows.labels, strict=True)):
        mark = "ok" if got == want else "WRONG"
        typer.echo(f"  row {i:>3}: predicted {got}  true {want}  {mark}")
    typer.echo(f"  accuracy {np.mean(predicted == rows.labels):.2%} on {rows.rows} rows")


def _predicted_labels(outputs: dict[str, Any]) -> Any:
    for value in outputs.values():
        if value.ndim == 1 and value.dtype.kind in "iu":
            return value
    for value in outputs.values():
        if value.ndim == 2 and value.dtype.kind == "f":
            return value.argmax(1)
    return None
