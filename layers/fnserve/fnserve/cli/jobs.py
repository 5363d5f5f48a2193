"""``fnserve submit``, ``fnserve results`` and ``fnserve outputs``: jobs sent to a queue or topic, their results
fetched, and a deployed stack's names for them."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from fnserve.cli.root import app, fail
from fnserve.core.errors import FnserveError


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

    from fnserve.stores import job_client

    if (queue is None) == (topic is None):
        raise fail("give the jobs' queue (--queue, an SQS queue URL) or topic (--topic, a Pub/Sub topic), not both")

    jobs = list(
        job_client.jobs_from_file(
            data,
            model,
            input_name=input_name,
            rows_per_job=rows_per_job,
            version=version,
            prefix=prefix or job_client.new_prefix(),
            binary=not json_data,
        )
    )
    try:
        with Progress(transient=True) as progress:
            task = progress.add_task("submitting", total=len(jobs))
            advance = functools.partial(progress.advance, task)
            if topic is not None:
                report = job_client.publish(topic, iter(jobs), bucket=bucket, progress=advance)
            else:
                report = job_client.submit(queue or "", iter(jobs), bucket=bucket, progress=advance)
    except FnserveError as exc:
        raise fail(exc.message) from None
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
    from fnserve.stores import job_client

    if table is not None and results_url is not None:
        raise fail("give where the results are: --table (DynamoDB) or --results (a Redis URL), not both")
    if table is None and results_url is None:
        raise fail(
            "give where the results are: --table (a DynamoDB table, or FNSERVE_RESULTS_TABLE) or --results "
            "(a Redis URL, or FNSERVE_RESULTS); `make run` prints the line for its table"
        )
    ids = [line.strip() for line in ids_file.read_text().splitlines() if line.strip()]
    found = job_client.fetch_results(table or results_url or "", ids)
    counts = f"done {len(found.done)}, failed {len(found.failed)}, pending {len(found.pending)}"
    if output is None:
        for line in job_client.jsonl_lines(found, ids):
            typer.echo(line)
        typer.echo(counts, err=True)
        return
    try:
        job_client.write_results(found, ids, output)
    except FnserveError as exc:
        raise fail(exc.message) from None
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
        raise fail(exc.message) from None
