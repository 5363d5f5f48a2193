"""The command line's root: the ``fnserve`` app and its command groups, the option every command that reads a manifest
takes, and how an error is said (one line; its traceback with --debug)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fnserve.core.errors import FnserveError
from fnserve.server.command import MANIFEST_ENV

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
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        from fnserve.core.extras import missing

        return missing(exc.name)
    if isinstance(exc, OSError):
        return str(exc)
    return f"{name}: {exc} (run with --debug for the traceback)"


def fail(message: str) -> typer.Exit:
    """The error ``message`` said as the command line says every error; raise what it returns."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)
