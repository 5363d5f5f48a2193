"""``fnserve local``: the SAM template's functions run here, behind a local gateway and an embedded AWS emulator,
and the lines to try them printed."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fnserve.cli.root import app, fail
from fnserve.core.errors import FnserveError
from fnserve.server.command import example_request

if TYPE_CHECKING:
    from fnserve.emulator.emulator import Emulator, Local


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
            raise fail(f"--parameter takes KEY=VALUE, not {item!r}")
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
        raise fail(exc.message) from None
    banner(emulator, local_, f"http://{host}:{port}", workers)
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


def banner(emulator: Emulator, local_: Local, url: str, workers: int) -> None:
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
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.models.manifest import TokenizeStep

    manifests = (Path(m) for spec in local_.functions.values() if (m := spec.env.get("FNSERVE_MANIFEST")))
    manifest = next((m for m in manifests if m.is_file()), None)
    if manifest is None:
        return None
    registry_log = logging.getLogger("fnserve.core.models.registry")
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
