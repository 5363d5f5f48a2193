"""``fnserve local``'s run in the foreground: the emulator started with its console, the lines to try printed, then
everything stopped on Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fnserve.aws.events import REGION
from fnserve.core.errors import FnserveError
from fnserve.emulator.console import Console
from fnserve.emulator.emulator import Emulator, Local
from fnserve.observability.logs import logger
from fnserve.server.command import example_request


def run(
    template: Path,
    *,
    host: str,
    port: int,
    workers: int,
    visibility_timeout: int | None,
    parameters: Mapping[str, str],
    log_file: Path | None,
    reload: bool,
    echo: Callable[[str], None] = print,
    manifest: Path | None = None,
) -> None:
    """Run the template's functions until SIGINT or SIGTERM; the console gets each invocation as Lambda's logs show
    it, ``log_file`` (default: a new file in the temp dir) the raw lines."""
    if log_file is None:
        log_file = Path(tempfile.mkstemp(prefix="fnserve-local-", suffix=".log")[1])
    with log_file.open("a", encoding="utf-8") as raw:
        console = Console(sys.stdout, raw)
        logger.registered_handler.setStream(console.stream("fnserve"))  # type: ignore[attr-defined]
        emulator = Emulator(
            template,
            host=host,
            port=port,
            workers=workers,
            visibility_timeout=visibility_timeout,
            parameters=dict(parameters),
            observer=console,
            reload=reload,
            manifest=manifest,
        )
        console.expect(["fnserve", *emulator.template.of_type("AWS::Serverless::Function")])
        local_ = emulator.start()
        banner(emulator, local_, f"http://{host}:{port}", workers, echo)
        echo(f"  logs  raw function logs (JSON, EMF metrics): {log_file}")
        if reload:
            root = emulator.root
            folders = [str(f.relative_to(root) if f.is_relative_to(root) else f) for f in emulator.watch_roots()]
            echo(f"  reload  a change under {', '.join(folders)} restarts its functions' workers")
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        echo("Ctrl-C stops it.")
        sys.stdout.flush()  # the banner's lines, now, for whoever reads a pipe or a file
        stop.wait()
        emulator.stop()


def banner(emulator: Emulator, local_: Local, url: str, workers: int, echo: Callable[[str], None] = print) -> None:
    """What ``fnserve local`` prints once it runs: routes, event sources, and lines to try."""
    from datetime import UTC, datetime

    echo(f"fnserve local: {len(local_.functions)} functions, {workers} worker(s) each; AWS at {local_.endpoint}")
    for route in emulator.routes:
        echo(f"  {route.method:<5} {url}{route.path} -> {route.function}")
    for source in emulator.sources:
        echo(f"  SQS   {source.queue_url} -> {source.function} (batch {source.batch_size}, window {source.window:g}s)")
    now = datetime.now(UTC)
    for schedule in emulator.app.schedules:
        due = schedule.next_after(now)
        when = f"next {due:%Y-%m-%d %H:%M} UTC" if due else "disabled" if not schedule.enabled else "on demand"
        echo(
            f"  timer {schedule.expression} -> {schedule.function} ({schedule.event}, {when}; now: "
            f"curl -s -X POST {url}/_fnserve/schedules/{schedule.function}/{schedule.event})"
        )
    for warning in emulator.app.warnings:
        echo(f"  warn  {warning}")
    said, curl = _auth_lines(emulator, local_)
    for line in said:
        echo(f"  auth  {line}")
    example = _served_example(local_)
    if example is None:  # not an fnserve manifest behind the functions: the template's own routes
        for route in emulator.routes[:3]:
            echo(f"  try   {curl} -X {route.method if route.method != 'ANY' else 'GET'} {url}{route.path}")
        return
    echo(f"  try   {curl} {url}/v2/models/{example.name}/infer -d '{example.request}'")
    for name, tensors in example.text_pipelines:  # a text, or a query and a document
        texts = ("A warm container answers.", "Warm containers answer requests at once.")
        inputs = [
            {"name": t, "shape": [1], "datatype": "BYTES", "data": [text]}
            for t, text in zip(tensors, texts, strict=False)
        ]
        echo(f"  try   {curl} {url}/v2/models/{name}/infer -d '{json.dumps({'inputs': inputs})}'")
    jobs = next((s.queue_url for s in emulator.sources if s.function == "BatchFunction"), None)
    table = next(iter(local_.tables.values()), None)
    if jobs and table and example.data is not None:
        echo(
            f"  jobs  AWS_ENDPOINT_URL={local_.endpoint} .venv/bin/fnserve submit "
            f"{example.data} --model {example.batch_model} --queue {jobs} --ids ids.txt"
        )
        from fnserve.aws.clients import endpoint_url

        tables_at = endpoint_url("dynamodb") or local_.endpoint  # DynamoDB may have an endpoint of its own
        echo(f"        AWS_ENDPOINT_URL={tables_at} .venv/bin/fnserve results ids.txt --table {table} -o out.jsonl")


def _auth_lines(emulator: Emulator, local_: Local) -> tuple[list[str], str]:
    """What the banner says of the API's authorisation (as the template declares it, enforced here), and the curl
    that the lines to try then start with."""
    from fnserve.emulator.auth import IamAuth, JwtAuth, LambdaAuth

    checks = [route.auth for route in emulator.routes if route.auth is not None]
    if not checks:
        return ["none: every request goes through (ApiAuth=NONE)"], "curl -s"
    check = checks[0]
    if isinstance(check, IamAuth):
        key = os.environ.get("AWS_ACCESS_KEY_ID", "")
        user = "local:local" if key == "local" else '"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"'
        return [
            "ApiAuth=IAM: requests are SigV4-signed (execute-api) with this machine's AWS credentials, as deployed; "
            "unsigned ones get 403. -p ApiAuth=APIKEY takes Bearer keys instead."
        ], f"curl -s --aws-sigv4 aws:amz:{REGION}:execute-api --user {user}"
    if isinstance(check, JwtAuth):
        return [
            f"ApiAuth=JWT: send Authorization: Bearer <a token from {check.issuer} for {', '.join(check.audiences)}>"
        ], 'curl -s -H "authorization: Bearer $TOKEN"'
    assert isinstance(check, LambdaAuth)
    secret = (
        local_.functions[check.function].env.get("FNSERVE_API_KEYS_SECRET", "")
        if check.function in local_.functions
        else ""
    )
    lines = [f"ApiAuth=APIKEY: send Authorization: Bearer KEY, checked by {check.function} as deployed"]
    if secret:
        from fnserve.aws.clients import client

        key = client("secretsmanager").get_secret_value(SecretId=secret)["SecretString"].splitlines()[0]
        lines.append(f"this run's key (local secret {secret.rsplit(':', 1)[-1]}): KEY={key}")
    return lines, 'curl -s -H "authorization: Bearer $KEY"'


@dataclass(frozen=True)
class _Example:
    name: str  # what the try line infers on (the first cascade, else the first model)
    request: str
    batch_model: str  # what the jobs lines submit to (the cascade's slow model, else the first model)
    data: str | None  # a data file beside the manifest, for the jobs lines
    text_pipelines: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (pipeline, its text inputs): those that tokenize


def _served_example(local_: Local) -> _Example | None:
    """Lines to try, from the manifest the template's functions serve (None when none serves one)."""
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.models.manifest.steps import TokenizeStep

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
            (p.name, tuple(n for n in (p.pre[0].input, p.pre[0].pair) if n is not None))
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
