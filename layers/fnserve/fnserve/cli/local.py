"""``fnserve local``: the SAM template's functions run here, behind a local gateway and an embedded AWS emulator,
and the lines to try them printed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fnserve.cli.root import app, fail
from fnserve.core.errors import FnserveError


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
    manifest: Annotated[
        Path | None,
        typer.Option(
            "--manifest",
            "-m",
            exists=True,
            dir_okay=False,
            help="A model manifest every function serves instead of the models layer's (its models beside it).",
        ),
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
    from fnserve.emulator.local import run

    overrides = {}
    for item in parameter or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise fail(f"--parameter takes KEY=VALUE, not {item!r}")
        overrides[key] = value
    try:
        run(
            template,
            host=host,
            port=port,
            workers=workers,
            visibility_timeout=visibility_timeout,
            parameters=overrides,
            log_file=log_file,
            reload=reload,
            echo=typer.echo,
            manifest=manifest,
        )
    except FnserveError as exc:
        raise fail(exc.message) from None
