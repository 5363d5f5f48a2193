"""The ``fnserve`` command line."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from fnserve.bench import prices
from fnserve.core.errors import FnserveError
from fnserve.server.command import (
    DEFAULT_HOST,
    DEFAULT_MANIFEST,
    DEFAULT_PORT,
    HOST_ENV,
    MANIFEST_ENV,
    PORT_ENV,
    ServeOptions,
    example_request,
)

if TYPE_CHECKING:
    import onnxruntime as ort

    from fnserve.datafiles import DataFile
    from fnserve.emulator.emulator import Emulator, Local
    from fnserve.quantize import Mode, QuantizeReport

HELP = (
    "fnserve: ONNX models served on AWS Lambda, in a container, or locally; batch jobs on SQS. "
    "Errors are one line; --debug shows their tracebacks."
)
app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=HELP, pretty_exceptions_enable=False, rich_markup_mode=None
)
cascade_app = typer.Typer(no_args_is_help=True, help="Fast-then-accurate model cascades.", rich_markup_mode=None)
app.add_typer(cascade_app, name="cascade")
models_app = typer.Typer(help="What a manifest serves, and publishing its files to a bucket.", rich_markup_mode=None)
app.add_typer(models_app, name="models")
manifest_app = typer.Typer(no_args_is_help=True, help="Edit a model manifest.", rich_markup_mode=None)
app.add_typer(manifest_app, name="manifest")

ManifestOpt = Annotated[
    Path,
    typer.Option(
        "--manifest",
        "-m",
        envvar=list(MANIFEST_ENV),
        help="Model manifest (TOML); default: FNSERVE_MANIFEST, else manifest.toml in the current directory.",
    ),
]


_debug = False


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False,
) -> None:
    global _debug
    _debug = debug


def main() -> None:
    """Entry point of the ``fnserve`` script: every error is one line saying what to do (a traceback with --debug)."""
    try:
        app()
    except Exception as exc:  # noqa: BLE001 - the command line's last word on any error
        if _debug:
            raise
        typer.secho(f"error: {explain(exc)}", fg=typer.colors.RED, err=True)
        raise SystemExit(1) from None


def explain(exc: BaseException) -> str:
    """An error as one line for a person at a shell: what went wrong, and what to do about it."""
    from fnserve.aws.clients import endpoint_url

    name = type(exc).__name__
    if isinstance(exc, FnserveError):
        return exc.message
    if name == "NoRegionError":
        return (
            "no AWS region is configured: set AWS_DEFAULT_REGION, or set AWS_ENDPOINT_URL to a local emulator "
            "(fnserve local prints it), which needs none"
        )
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return (
            "no AWS credentials were found: configure them (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY), or set AWS_ENDPOINT_URL to a local emulator, which needs none"
        )
    if name in ("EndpointConnectionError", "ConnectionClosedError", "ConnectTimeoutError", "ReadTimeoutError"):
        where = endpoint_url("sqs") or "AWS"
        return f"{where} cannot be reached ({exc}): is the emulator (fnserve local) or your network up?"
    if name == "ClientError":
        error = getattr(exc, "response", {}).get("Error", {})
        operation = getattr(exc, "operation_name", "the AWS call")
        return f"{operation} failed: {error.get('Code', '?')}: {error.get('Message', '')} (check the names and region)"
    if isinstance(exc, OSError):
        return str(exc)
    return f"{name}: {exc} (run with --debug for the traceback)"


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context, manifest: ManifestOpt = DEFAULT_MANIFEST) -> None:
    """List what a manifest serves: its models (inputs and outputs), its pipelines and its cascades."""
    if ctx.invoked_subcommand is not None:
        return
    from fnserve.core.service import InferenceService

    try:
        service = InferenceService.from_manifest(manifest)
        for name in service.registry.names():
            meta = service.model_metadata(name)
            group = service.registry.manifest.group_of(name)
            placed = f"  in worker group {group.name!r} ({group.workers} worker(s))" if group is not None else ""
            typer.echo(f"{name}  versions {', '.join(meta['versions'])}{placed}")
            _echo_tensors(meta)
        for pipeline in service.registry.manifest.pipelines:
            steps = " -> ".join([*(s.step for s in pipeline.pre), pipeline.model, *(s.step for s in pipeline.post)])
            typer.echo(f"{pipeline.name}  pipeline: {steps}")
            _echo_tensors(service.model_metadata(pipeline.name))
        for cascade in service.registry.manifest.cascades:
            rule = f"{cascade.rule} of {cascade.output!r} ({cascade.scores}) >= {cascade.threshold:g}"
            typer.echo(f"{cascade.name}  cascade: {cascade.fast} at once, {cascade.slow} follows up unless {rule}")
            _echo_tensors(service.model_metadata(cascade.fast, cascade.fast_version))
    except FnserveError as exc:
        raise _fail(exc.message) from None


def _echo_tensors(meta: dict[str, Any]) -> None:
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
    from fnserve.publish import push

    try:
        pushed = push(manifest, destination)
    except FnserveError as exc:
        raise _fail(exc.message) from None
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
) -> None:
    """Add a model to a manifest (created if missing): its sha256 computed, its graph loaded and shown."""
    from fnserve.publish import add_model

    try:
        added = add_model(
            manifest,
            model,
            name,
            version=version,
            description=description,
            max_batch_size=max_batch_size,
            copy=copy,
        )
    except FnserveError as exc:
        raise _fail(exc.message) from None
    if added.copied:
        typer.echo(f"copied {model} to {added.model_file}")
    entry = added.entry
    typer.echo(f"added {entry['name']} version {entry['version']} to {manifest} (sha256 {entry['sha256']})")
    inputs, outputs = ([s.to_metadata() for s in specs] for specs in (added.inputs, added.outputs))
    _echo_tensors({"inputs": inputs, "outputs": outputs})


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
    from fnserve.core.cascade import settle
    from fnserve.core.service import InferenceService
    from fnserve.datafiles import read_data

    try:
        service = InferenceService.from_manifest(manifest)
        cascade = next((c for c in service.registry.manifest.cascades if c.name == model), None)
        if cascade is not None and version is not None:
            raise _fail(f"cascade {model!r} has no versions")
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
        raise _fail(exc.message) from None
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


@app.command()
def quantize(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="ONNX model to quantize.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the quantized model.")],
    mode: Annotated[str, typer.Option(help="dynamic or static.")] = "dynamic",
    per_channel: Annotated[bool, typer.Option("--per-channel", help="Per-channel weight scales.")] = False,
    calibration: Annotated[
        Path | None, typer.Option(help="Calibration inputs (.npy/.npz); required for static.")
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
    from fnserve.datafiles import read_data

    if mode not in ("dynamic", "static"):
        raise _fail(f"--mode must be dynamic or static, not {mode!r}")
    if mode == "static" and calibration is None:
        raise _fail("static quantization needs --calibration")
    before = q.session(model, threads)
    names = [arg.name for arg in before.get_inputs()]
    try:
        calib = read_data(calibration, names) if calibration else None
        valid = read_data(validation, names) if validation else None
    except FnserveError as exc:
        raise _fail(exc.message) from None
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
            raise _fail(
                f"the quantized model is confidently slower at batch {', '.join(map(str, slower))} (see above); "
                f"not writing {output} (use --force to write it anyway)"
            )
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(candidate, output)
    from fnserve.publish import file_sha256

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
    from fnserve.datafiles import read_data

    if level not in o.LEVELS:
        raise _fail(f"--level must be basic or extended, not {level!r} (all adds layouts for this machine's CPU)")
    before = q.session(model, threads)
    try:
        sample = read_data(validation, [a.name for a in before.get_inputs()]) if validation else None
    except FnserveError as exc:
        raise _fail(exc.message) from None
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp) / "optimized.onnx"
        report = o.optimize_and_compare(
            model, candidate, level, sample or q.synthetic_inputs(before), rounds, starts, threads
        )
        for line in report.lines():
            typer.echo(line)
        refused = [f"its output(s) {', '.join(report.unequal)} differ"] if report.unequal else []
        if slower := report.slower_at():
            refused.append(f"it is confidently slower at batch {', '.join(map(str, slower))}")
        if refused and not force:
            raise _fail(f"{' and '.join(refused)} (see above); not writing {output} (use --force to write it anyway)")
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(candidate, output)
    from fnserve.publish import file_sha256

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
            mode=mode + (" per-channel" if per_channel else " per-tensor"),
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
    return report


@app.command()
def serve(
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    host: Annotated[str, typer.Option(help="Address to listen on.", envvar=list(HOST_ENV))] = DEFAULT_HOST,
    port: Annotated[
        int,
        typer.Option(
            help="Port to listen on; else FNSERVE_PORT, else PORT (what Cloud Run and Knative give a container).",
            envvar=list(PORT_ENV),
        ),
    ] = DEFAULT_PORT,
    workers: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Inference worker processes, each with every model (default FNSERVE_PARALLEL_WORKERS, or "
            "SageMaker's SAGEMAKER_MODEL_SERVER_WORKERS); 0 runs inference in the server process, best for tiny "
            "models. Without this and --processes, the layout is chosen at start from the models' batch-1 time, "
            "and the log says why. With --gpu-workers: CPU workers that take the GPU's overflow.",
        ),
    ] = None,
    gpu_workers: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Inference workers on the GPU, each model on its manifest providers (default FNSERVE_GPU_WORKERS).",
        ),
    ] = None,
    gpu_capacity: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Calls in flight on the GPU workers before calls overflow to the --workers CPU workers "
            "(default FNSERVE_GPU_CAPACITY, else two per GPU worker).",
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Front processes sharing the port, each with its own workers (default FNSERVE_SERVER_PROCESSES, "
            "else 1 when --workers is given); more than one pays for tiny models, whose cost is HTTP and JSON.",
        ),
    ] = None,
    grpc_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Also serve the Open Inference Protocol over gRPC on this port (default FNSERVE_GRPC_PORT; "
            "off when unset). Needs fnserve[grpc].",
        ),
    ] = None,
    fast_start: Annotated[
        bool,
        typer.Option(
            "--fast-start",
            help="Start to the first answer fast, for platforms that scale to zero: one front process per CPU "
            "unless --processes/--workers say, no layout timed at start (default FNSERVE_FAST_START).",
        ),
    ] = False,
    cpu_affinity: Annotated[
        bool,
        typer.Option(
            "--cpu-affinity",
            help="Pin each process running inference to its share of the CPUs (default FNSERVE_CPU_AFFINITY).",
        ),
    ] = False,
    access_log: Annotated[
        bool, typer.Option("--access-log", help="One structured log line per request (costly at high rates).")
    ] = False,
) -> None:
    """Serve the manifest's models over the V2 HTTP API (uvicorn), and gRPC with --grpc-port, as in a container."""
    from fnserve.server.command import serve as run

    options = ServeOptions(
        manifest,
        host,
        port,
        workers,
        gpu_workers,
        gpu_capacity,
        processes,
        grpc_port,
        fast_start,
        cpu_affinity,
        access_log,
    )
    try:
        run(options, echo=typer.echo)
    except FnserveError as exc:
        raise _fail(exc.message) from None


@app.command()
def submit(
    data: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="Inputs: .npy or .npz (tensors), .jsonl (V2 requests, or texts), .txt (one text a line).",
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="Model to run.")],
    queue: Annotated[str | None, typer.Option("--queue", envvar="FNSERVE_JOBS_QUEUE", help="SQS queue URL.")] = None,
    topic: Annotated[
        str | None,
        typer.Option("--topic", envvar="FNSERVE_JOBS_TOPIC", help="Pub/Sub topic (projects/P/topics/T), instead."),
    ] = None,
    version: Annotated[str | None, typer.Option(help="Model version (default: latest).")] = None,
    bucket: Annotated[
        str | None,
        typer.Option(
            envvar="FNSERVE_RESULTS_BUCKET",
            help="Bucket for jobs over the message size limit: an S3 bucket's name, or gs://name.",
        ),
    ] = None,
    input_name: Annotated[
        str | None, typer.Option(help="The input a .npy file's array goes to (default: input), or texts' (text).")
    ] = None,
    rows_per_job: Annotated[int, typer.Option(min=1, help="Rows (or texts) in each job.")] = 1,
    prefix: Annotated[str | None, typer.Option(help="Job id prefix (default: a new random one).")] = None,
    ids_file: Annotated[Path | None, typer.Option("--ids", help="Write the job ids here, one per line.")] = None,
    json_data: Annotated[
        bool,
        typer.Option(
            "--json-data",
            help="Send .npy/.npz tensors as JSON numbers instead of binary (base64 binary_data, the default: "
            "exact, and smaller for real-valued data).",
        ),
    ] = False,
) -> None:
    """Enqueue inference jobs (SQS: 10 per SendMessageBatch; Pub/Sub: batched publishes) and list their ids."""
    from rich.progress import Progress

    from fnserve import jobsclient

    if (queue is None) == (topic is None):
        raise _fail("give the jobs' queue (--queue, an SQS queue URL) or topic (--topic, a Pub/Sub topic), not both")

    jobs = list(
        jobsclient.jobs_from_file(
            data,
            model,
            input_name=input_name,
            rows_per_job=rows_per_job,
            version=version,
            prefix=prefix or jobsclient.new_prefix(),
            binary=not json_data,
        )
    )
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task("submitting", total=len(jobs))
            advance = functools.partial(progress.advance, task)
            if topic is not None:
                report = jobsclient.publish(topic, iter(jobs), bucket=bucket, progress=advance)
            else:
                report = jobsclient.submit(queue or "", iter(jobs), bucket=bucket, progress=advance)
    except FnserveError as exc:
        raise _fail(exc.message) from None
    if ids_file:
        ids_file.write_text("".join(f"{i}\n" for i in report.ids))
    else:
        for job_id in report.ids:
            typer.echo(job_id)
    typer.echo(f"submitted {len(report.ids)} jobs ({report.by_reference} by reference to the bucket)", err=True)
    if report.failed:
        for job_id, reason in report.failed.items():
            typer.echo(f"not sent: {job_id}: {reason}", err=True)
        raise typer.Exit(code=1)


@app.command()
def results(
    ids_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Job ids, one per line.")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write results to .npy, .npz or .jsonl (default: JSON lines on stdout)."),
    ] = None,
    table: Annotated[
        str | None, typer.Option("--table", envvar="FNSERVE_RESULTS_TABLE", help="DynamoDB results table.")
    ] = None,
    results_url: Annotated[
        str | None,
        typer.Option("--results", envvar="FNSERVE_RESULTS", help="Redis URL of the results (redis://host:6379/0)."),
    ] = None,
) -> None:
    """Fetch stored results of jobs; say which are done, failed or still pending."""
    from fnserve import jobsclient

    if table is not None and results_url is not None:
        raise _fail("give where the results are: --table (DynamoDB) or --results (a Redis URL), not both")
    if table is None and results_url is None:
        raise _fail(
            "give where the results are: --table (a DynamoDB table, or FNSERVE_RESULTS_TABLE) or --results "
            "(a Redis URL, or FNSERVE_RESULTS); `make run` prints the line for its table"
        )
    ids = [line.strip() for line in ids_file.read_text().splitlines() if line.strip()]
    found = jobsclient.fetch_results(table or results_url or "", ids)
    counts = f"done {len(found.done)}, failed {len(found.failed)}, pending {len(found.pending)}"
    if output is None:
        for line in jobsclient.jsonl_lines(found, ids):
            typer.echo(line)
        typer.echo(counts, err=True)
        return
    try:
        jobsclient.write_results(found, ids, output)
    except FnserveError as exc:
        raise _fail(exc.message) from None
    typer.echo(f"{counts} -> {output}")
    for job_id, reason in list(found.failed.items())[:20]:
        typer.echo(f"  failed {job_id}: {reason}")


@app.command()
def outputs(
    stack_name: Annotated[
        str, typer.Option("--stack-name", help="The deployed stack (samconfig.toml's stack_name).")
    ] = "fnserve",
) -> None:
    """Print a deployed stack's outputs as shell exports: eval "$(fnserve outputs)" sets $ApiUrl, $JobsQueueUrl,
    $ResultsTableName and the rest, the names the docs use."""
    from fnserve.aws import stack

    try:
        typer.echo(stack.exports(stack.outputs(stack_name)), nl=False)
    except FnserveError as exc:
        raise _fail(exc.message) from None


@app.command()
def bench(
    manifest: Annotated[
        Path,
        typer.Argument(
            envvar=list(MANIFEST_ENV), help="Model manifest (default FNSERVE_MANIFEST, else manifest.toml)."
        ),
    ] = DEFAULT_MANIFEST,
    model: Annotated[str | None, typer.Option("--model", help="Model or pipeline (default: the only model).")] = None,
    data: Annotated[
        Path | None, typer.Option("--data", exists=True, dir_okay=False, help="Requests' inputs: .npy or .npz.")
    ] = None,
    request: Annotated[
        list[Path] | None,
        typer.Option("--request", exists=True, dir_okay=False, help="A V2 JSON request file (repeatable)."),
    ] = None,
    rows: Annotated[int, typer.Option(min=1, help="Rows per request made from metadata or --data.")] = 1,
    p99_ms: Annotated[
        float | None,
        typer.Option(
            "--p99-ms", help="Latency budget: recommend the most throughput within it (--targets: the cheapest target)."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Directory for bench.json, the snippet, the plots, the profile.")] = Path(
        "fnserve-bench"
    ),
    sweep: Annotated[
        bool | None,
        typer.Option(
            help="Sweep server configurations (default: yes, unless --targets; --no-sweep: profile or size only)."
        ),
    ] = None,
    stages: Annotated[str, typer.Option(help="Sweep stages, comma-separated.")] = "layout,threads,batching",
    seconds: Annotated[float, typer.Option(min=0.2, help="Seconds of load at each concurrency level.")] = 2.0,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Highest concurrency tried.")] = 64,
    generator: Annotated[
        str,
        typer.Option(
            help="Load generator: auto (perf_analyzer, else wrk, when installed), perf_analyzer, wrk, built-in."
        ),
    ] = "auto",
    confirm_seconds: Annotated[
        float, typer.Option(min=0, help="Seconds of the confirming run of the recommendation (0: none).")
    ] = 5.0,
    floor_seconds: Annotated[
        float, typer.Option(min=0.01, help="Seconds of raw onnxruntime runs per batch size and thread count.")
    ] = 0.5,
    profile: Annotated[
        bool, typer.Option("--profile", help="Profile the recommended configuration under load with py-spy.")
    ] = False,
    profile_seconds: Annotated[float, typer.Option(min=1, help="Seconds the profile samples.")] = 10.0,
    lambda_: Annotated[
        bool, typer.Option("--lambda", help="Emulate Lambda memory sizes (CPU quotas): latency and cost per size.")
    ] = False,
    memory: Annotated[
        str, typer.Option(help="Lambda memory sizes in MB, comma-separated.")
    ] = "512,1024,1769,2048,3008",
    lambda_seconds: Annotated[float, typer.Option(min=0.1, help="Seconds of invocations per Lambda size.")] = 3.0,
    price_gb_second: Annotated[
        float, typer.Option(help="Lambda's price per GB-second (x86, us-east-1).")
    ] = prices.LAMBDA_GB_SECOND["x86_64"],
    price_per_million: Annotated[
        float, typer.Option(help="Lambda's price per million requests.")
    ] = prices.LAMBDA_PER_MILLION,
    targets: Annotated[
        bool,
        typer.Option(
            "--targets",
            help="Cost a month and p99 on each target (Lambda, SageMaker Serverless, Cloud Run, a container) at the "
            "traffic of --rps, from a request's CPU time and cold start on this machine; the cheapest first.",
        ),
    ] = False,
    rps: Annotated[float, typer.Option(min=0.000001, help="Mean requests a second (--targets).")] = 1.0,
    peak_rps: Annotated[
        float | None, typer.Option(min=0.000001, help="Peak requests a second (--targets; default: the mean).")
    ] = None,
    bytes_in: Annotated[
        int | None, typer.Option(min=0, help="Request bytes (--targets; default: the request bench sends).")
    ] = None,
    bytes_out: Annotated[
        int | None, typer.Option(min=0, help="Answer bytes (--targets; default: the answer to that request).")
    ] = None,
    cloud_run_vcpus: Annotated[float, typer.Option(min=0.08, help="Cloud Run's CPU setting (--targets).")] = 1.0,
    container_vcpus: Annotated[
        float | None,
        typer.Option(min=0.25, help="The container's vCPUs (--targets; default: the least Fargate size for the peak)."),
    ] = None,
    container_vcpu_hour: Annotated[
        float, typer.Option(help=f"The container's $ per vCPU-hour (Fargate x86, us-east-1, {prices.AS_OF}).")
    ] = prices.FARGATE_VCPU_HOUR["x86_64"],
    container_gb_hour: Annotated[
        float, typer.Option(help=f"The container's $ per GB-hour (Fargate x86, us-east-1, {prices.AS_OF}).")
    ] = prices.FARGATE_GB_HOUR["x86_64"],
) -> None:
    """Measure the raw onnxruntime floor, sweep server layouts, threads, pinning and batching under load on
    loopback, and recommend the fastest configuration; --profile writes a flame graph, --lambda sizes Lambda,
    --targets prices every target at a traffic profile."""
    from fnserve.bench.cost import Traffic
    from fnserve.bench.load import have_wrk
    from fnserve.bench.main import Options
    from fnserve.bench.main import bench as run_bench
    from fnserve.bench.perf_analyzer import have as have_perf_analyzer
    from fnserve.bench.sweep import LoadOptions
    from fnserve.bench.targets import Choices
    from fnserve.bench.tuner import STAGES

    chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    if unknown := [s for s in chosen if s not in STAGES]:
        raise _fail(f"unknown --stages {unknown}; they are {', '.join(STAGES)}")
    if generator not in ("auto", "perf_analyzer", "wrk", "built-in"):
        raise _fail(f"--generator is auto, perf_analyzer, wrk or built-in, not {generator!r}")
    if generator == "wrk" and not have_wrk():
        raise _fail("--generator wrk: wrk is not installed")
    if generator == "perf_analyzer" and not have_perf_analyzer():
        raise _fail("--generator perf_analyzer: perf_analyzer is not installed (make perf-analyzer sets it up)")
    try:
        sizes = tuple(int(m) for m in memory.split(",") if m.strip()) if lambda_ else ()
    except ValueError:
        raise _fail(f"--memory takes sizes in MB separated by commas, not {memory!r}") from None
    if any(not 128 <= m <= 10240 for m in sizes):
        raise _fail("Lambda memory sizes are 128 to 10240 MB")
    options = Options(
        manifest=manifest,
        model=model,
        data=data,
        request_files=tuple(request or ()),
        rows=rows,
        p99_ms=p99_ms,
        out=out,
        sweep=sweep if sweep is not None else not targets,
        stages=chosen,
        load=LoadOptions(seconds=seconds, max_concurrency=max_concurrency, generator=generator),
        confirm_seconds=confirm_seconds,
        floor_seconds=floor_seconds,
        profile=profile,
        profile_seconds=profile_seconds,
        lambda_sizes=sizes,
        lambda_seconds=lambda_seconds,
        price_gb_second=price_gb_second,
        price_per_million=price_per_million,
        targets=Traffic(
            rps,
            peak_rps,
            bytes_in,
            bytes_out,
            Choices(
                lambda_gb_second_x86=price_gb_second,
                lambda_per_million=price_per_million,
                container_vcpu_hour=container_vcpu_hour,
                container_gb_hour=container_gb_hour,
                cloud_run_vcpus=cloud_run_vcpus,
                container_vcpus=container_vcpus,
            ),
        )
        if targets
        else None,
    )
    if targets and peak_rps is not None and peak_rps < rps:
        raise _fail(f"--peak-rps {peak_rps:g} is below the mean, --rps {rps:g}")
    try:
        run_bench(options)
    except FnserveError as exc:
        raise _fail(exc.message) from None


@cascade_app.command("tune")
def cascade_tune(
    cascade: Annotated[str, typer.Argument(help="Cascade name in the manifest.")],
    data: Annotated[Path, typer.Option("--data", exists=True, help="Labelled validation data (.npz).")],
    manifest: ManifestOpt = DEFAULT_MANIFEST,
    target_accuracy: Annotated[float | None, typer.Option(help="Recommend the threshold reaching this.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of accuracy against slow-model share.")] = None,
) -> None:
    """Score thresholds on labelled data: slow-model share skipped, and combined accuracy."""
    from fnserve import tune as tuning
    from fnserve.core.service import InferenceService
    from fnserve.datafiles import read_data

    try:
        service = InferenceService.from_manifest(manifest)
        settings = {c.name: c for c in service.registry.manifest.cascades}.get(cascade)
        if settings is None:
            raise _fail(f"no cascade {cascade!r} in {manifest}")
        names = [spec["name"] for spec in service.model_metadata(settings.fast, settings.fast_version)["inputs"]]
        result = tuning.tune(service, settings, read_data(data, names))
    except FnserveError as exc:
        raise _fail(exc.message) from None
    recommended = result.recommend(target_accuracy) if target_accuracy is not None else None
    typer.echo(
        f"cascade {cascade}: {settings.fast} alone {result.fast_accuracy:.4f}, {settings.slow} alone "
        f"{result.slow_accuracy:.4f}; rule {settings.rule} on {settings.output} ({settings.scores})"
    )
    for line in tuning.table(result, recommended):
        typer.echo(line)
    if target_accuracy is not None:
        if recommended is None:
            typer.echo(f"no threshold reaches accuracy {target_accuracy:g}")
        else:
            typer.echo(
                f"recommended threshold {recommended.threshold:g}: accuracy {recommended.accuracy:.4f}, "
                f"slow model skipped for {recommended.skip_share:.1%} of requests"
            )
    if plot is not None:
        tuning.plot(result, settings, plot, target_accuracy)
        typer.echo(f"wrote {plot}")


@app.command()
def local(
    template: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="The SAM template.")] = Path(
        "template.yaml"
    ),
    host: Annotated[str, typer.Option(help="Address of the HTTP gateway.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the HTTP gateway.")] = 3000,
    workers: Annotated[int, typer.Option(min=1, help="Warm workers (containers) per function.")] = 1,
    visibility_timeout: Annotated[
        int | None, typer.Option(min=0, help="Override every queue's visibility timeout (seconds), for quick retries.")
    ] = None,
    parameter: Annotated[
        list[str] | None, typer.Option("--parameter", "-p", help="Template parameter override, KEY=VALUE (repeatable).")
    ] = None,
    log_file: Annotated[
        Path | None,
        typer.Option(help="Where the functions' raw log lines (JSON, EMF) go; default: a new file in the temp dir."),
    ] = None,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Watch each function's code, layers and models: a change restarts its workers (the next "
            "invocation is a cold start with the new code; running ones finish first).",
        ),
    ] = False,
) -> None:
    """Run the template's functions locally: HTTP gateway, SQS event sources, and an embedded AWS emulator.

    The console shows each invocation as Lambda's logs do (START, the function's logs made
    readable, END, REPORT with duration and memory); the raw lines go to the log file.
    """
    import signal
    import sys
    import threading

    from fnserve.emulator.console import Console
    from fnserve.emulator.emulator import Emulator
    from fnserve.observability.logs import logger

    overrides = {}
    for item in parameter or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise _fail(f"--parameter takes KEY=VALUE, not {item!r}")
        overrides[key] = value
    if log_file is None:
        log_file = Path(tempfile.mkstemp(prefix="fnserve-local-", suffix=".log")[1])
    raw = log_file.open("a", encoding="utf-8")
    console = Console(sys.stdout, raw)
    logger.registered_handler.setStream(console.stream("fnserve"))  # type: ignore[attr-defined]
    emulator = Emulator(
        template,
        host=host,
        port=port,
        workers=workers,
        visibility_timeout=visibility_timeout,
        parameters=overrides,
        observer=console,
        reload=reload,
    )
    console.expect(["fnserve", *emulator.template.of_type("AWS::Serverless::Function")])
    try:
        local_ = emulator.start()
    except FnserveError as exc:
        raise _fail(exc.message) from None
    _local_banner(emulator, local_, f"http://{host}:{port}", workers)
    typer.echo(f"  logs  raw function logs (JSON, EMF metrics): {log_file}")
    if reload:
        root = emulator.root
        folders = [str(f.relative_to(root) if f.is_relative_to(root) else f) for f in emulator.watch_roots()]
        typer.echo(f"  reload  a change under {', '.join(folders)} restarts its functions' workers")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    typer.echo("Ctrl-C stops it.")
    sys.stdout.flush()  # the banner's lines, now, for whoever reads a pipe or a file
    stop.wait()
    emulator.stop()
    raw.close()


def _local_banner(emulator: Emulator, local_: Local, url: str, workers: int) -> None:
    """What ``fnserve local`` prints once it runs: routes, event sources, and lines to try."""
    from datetime import UTC, datetime

    typer.echo(f"fnserve local: {len(local_.functions)} functions, {workers} worker(s) each; AWS at {local_.endpoint}")
    for route in emulator.routes:
        typer.echo(f"  {route.method:<5} {url}{route.path} -> {route.function}")
    for source in emulator.sources:
        typer.echo(
            f"  SQS   {source.queue_url} -> {source.function} (batch {source.batch_size}, window {source.window:g}s)"
        )
    now = datetime.now(UTC)
    for schedule in emulator.app.schedules:
        due = schedule.next_after(now)
        when = f"next {due:%Y-%m-%d %H:%M} UTC" if due else "disabled" if not schedule.enabled else "on demand"
        typer.echo(
            f"  timer {schedule.expression} -> {schedule.function} ({schedule.event}, {when}; now: "
            f"curl -s -X POST {url}/_fnserve/schedules/{schedule.function}/{schedule.event})"
        )
    for warning in emulator.app.warnings:
        typer.echo(f"  warn  {warning}")
    example = _served_example(local_)
    if example is None:  # not an fnserve manifest behind the functions: the template's own routes
        for route in emulator.routes[:3]:
            typer.echo(f"  try   curl -s -X {route.method if route.method != 'ANY' else 'GET'} {url}{route.path}")
        return
    typer.echo(f"  try   curl -s {url}/v2/models/{example.name}/infer -d '{example.request}'")
    for name, tensor in example.text_pipelines:
        text = {"inputs": [{"name": tensor, "shape": [1], "datatype": "BYTES", "data": ["A warm container answers."]}]}
        typer.echo(f"  try   curl -s {url}/v2/models/{name}/infer -d '{json.dumps(text)}'")
    jobs = next((s.queue_url for s in emulator.sources if s.function == "BatchFunction"), None)
    table = next(iter(local_.tables.values()), None)
    if jobs and table and example.data is not None:
        typer.echo(
            f"  jobs  AWS_ENDPOINT_URL={local_.endpoint} .venv/bin/fnserve submit "
            f"{example.data} --model {example.batch_model} --queue {jobs} --ids ids.txt"
        )
        from fnserve.aws.clients import endpoint_url

        tables_at = endpoint_url("dynamodb") or local_.endpoint  # DynamoDB may have an endpoint of its own
        typer.echo(
            f"        AWS_ENDPOINT_URL={tables_at} .venv/bin/fnserve results ids.txt --table {table} -o out.jsonl"
        )


@dataclass(frozen=True)
class _Example:
    name: str  # what the try line infers on (the first cascade, else the first model)
    request: str
    batch_model: str  # what the jobs lines submit to (the cascade's slow model, else the first model)
    data: str | None  # a data file beside the manifest, for the jobs lines
    text_pipelines: tuple[tuple[str, str], ...] = ()  # (pipeline, input) of those whose first step tokenizes


def _served_example(local_: Local) -> _Example | None:
    """Lines to try, from the manifest the template's functions serve (None when none serves one)."""
    from fnserve.core.manifest import TokenizeStep
    from fnserve.core.service import InferenceService

    manifests = (Path(m) for spec in local_.functions.values() if (m := spec.env.get("FNSERVE_MANIFEST")))
    manifest = next((m for m in manifests if m.is_file()), None)
    if manifest is None:
        return None
    registry_log = logging.getLogger("fnserve.core.registry")
    level = registry_log.level
    registry_log.setLevel(logging.WARNING)  # the functions load the models and say so; here, quietly
    try:
        service = InferenceService.from_manifest(manifest)
        cascades = service.registry.manifest.cascades
        first = service.registry.names()[0]
        name, fast, batch_model = (cascades[0].name, cascades[0].fast, cascades[0].slow) if cascades else (first,) * 3
        request = example_request(service.model_metadata(fast))
        texts = tuple(
            (p.name, p.pre[0].input)
            for p in service.registry.manifest.pipelines
            if p.pre and isinstance(p.pre[0], TokenizeStep)
        )
    except FnserveError:
        return None
    finally:
        registry_log.setLevel(level)
    # A data file beside the manifest for the jobs lines: held-out data first (what the demo ships).
    files = sorted(manifest.parent.glob("*.npz"), key=lambda f: ("holdout" not in f.name, f.name))
    data = files[0] if files else None
    shown = None
    if data is not None:
        shown = str(data.relative_to(Path.cwd())) if data.is_relative_to(Path.cwd()) else str(data)
    return _Example(name, request, batch_model, shown, texts)
