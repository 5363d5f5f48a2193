"""``fnserve serve`` as a library call: the command line's options, the settings made of them and of the
environment, the server started, and the lines it prints once it listens.

The command line (:mod:`fnserve.cli`) parses its options into :class:`ServeOptions` and calls :func:`serve`. A bare
``fnserve serve``, the command every image runs on the platforms that scale to zero, gives no option to parse: the
``fnserve`` script (:mod:`fnserve.entry`) reads them from the environment as the command line would
(:func:`options_from_environment`), without importing typer or building its parser, whose import and parse (and
the pydantic typer brings) are a large share of that start (docs/design/start.md).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fnserve.core.errors import ConfigError

if TYPE_CHECKING:
    from fnserve.core.execution.service import InferenceService
    from fnserve.settings import Settings

DEFAULT_MANIFEST = Path("manifest.toml")  # in the current directory, when FNSERVE_MANIFEST names none
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# The variables the command line reads its options from, each option's in the order it tries them.
MANIFEST_ENV = ("FNSERVE_MANIFEST",)
HOST_ENV = ("FNSERVE_HOST",)
PORT_ENV = ("FNSERVE_PORT", "PORT")  # PORT: what Cloud Run and Knative give a container


@dataclass(frozen=True)
class ServeOptions:
    """What ``fnserve serve``'s options say; None (or False) leaves a setting to its ``FNSERVE_*`` variable."""

    manifest: Path = DEFAULT_MANIFEST
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    workers: int | None = None
    gpu_workers: int | None = None
    gpu_capacity: int | None = None
    processes: int | None = None
    grpc_port: int | None = None
    fast_start: bool = False
    cpu_affinity: bool = False
    access_log: bool = False


def options_from_environment(environ: Mapping[str, str]) -> ServeOptions | None:
    """A bare ``fnserve serve``'s options, read as the command line reads them (the first variable of each that is
    set and not empty); None where one holds what it would refuse (a port that is not a number), so that the
    command line says so its own way."""
    port = _first(environ, PORT_ENV)
    if port is not None and not port.strip().isdigit():
        return None
    return ServeOptions(
        manifest=Path(_first(environ, MANIFEST_ENV) or DEFAULT_MANIFEST),
        host=_first(environ, HOST_ENV) or DEFAULT_HOST,
        port=DEFAULT_PORT if port is None else int(port),
    )


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((environ[name] for name in names if environ.get(name)), None)


def serve(options: ServeOptions, echo: Callable[[str], None] = print) -> None:
    """Settings from ``options`` over the environment, then the server until SIGINT or SIGTERM; ``echo`` prints
    the lines a person tries once it listens. A :class:`~fnserve.core.errors.FnserveError` says what to fix."""
    from fnserve.observability import logs
    from fnserve.server.serve import serve as run_server
    from fnserve.settings import Settings, sagemaker_settings

    # Log lines a person reads at a terminal; JSON for whatever collects them (a container's, a pipe's reader).
    # The server's other processes inherit the choice.
    chosen = os.environ.get(logs.FORMAT_ENV, "auto")
    if chosen == "auto":
        os.environ[logs.FORMAT_ENV] = chosen = "console" if sys.stdout.isatty() else "json"
    if chosen == "console":
        logs.readable()

    overrides: dict[str, Any] = {"manifest": str(options.manifest.resolve()), **sagemaker_settings(os.environ)}
    for option, setting in (
        ("workers", "parallel_workers"),
        ("gpu_workers", "gpu_workers"),
        ("gpu_capacity", "gpu_capacity"),
        ("processes", "server_processes"),
        ("grpc_port", "grpc_port"),
    ):
        if (value := getattr(options, option)) is not None:
            overrides[setting] = value
    if options.cpu_affinity:
        overrides["cpu_affinity"] = True
    if options.fast_start:
        overrides["fast_start"] = True
    if options.access_log or "FNSERVE_ACCESS_LOG" not in os.environ:
        overrides["access_log"] = options.access_log
    settings = Settings(**overrides)
    if settings.grpc_port == options.port:  # a platform's PORT may land on the image's gRPC port
        raise ConfigError(
            f"HTTP and gRPC both asked for port {options.port}: move gRPC with --grpc-port or FNSERVE_GRPC_PORT"
        )

    def ready(service: InferenceService | None, settings: Settings) -> None:
        for line in banner(options.host, options.port, service, settings):
            echo(line)

    run_server(settings, options.host, options.port, on_ready=ready)


def banner(host: str, port: int, service: InferenceService | None, settings: Settings) -> list[str]:
    """What ``fnserve serve`` prints once it listens: where, how, and lines to try (without a request to try where
    the front processes of a fast start load the models, and this process has none to describe)."""
    url = f"http://{host}:{port}"
    keyed = bool(settings.api_keys or settings.api_keys_file or settings.api_keys_secret)
    curl = "curl -s -H 'authorization: Bearer KEY'" if keyed else "curl -s"
    where = f"{settings.parallel_workers} inference worker(s)" if settings.parallel_workers else "in-process"
    if settings.gpu_workers:
        where = f"{settings.gpu_workers} GPU worker(s)" + (
            f" overflowing to {settings.parallel_workers} CPU worker(s)" if settings.parallel_workers else ""
        )
    if settings.server_processes > 1:
        where = f"{settings.server_processes} server processes, each {where}"
    if service is None:
        from fnserve.core.models.manifest.loading import load_manifest

        names = list(dict.fromkeys(model.name for model in load_manifest(settings.manifest).models))
        return [
            f"fnserve: {len(names)} models on {url}, {where}, loading; Ctrl-C stops.",
            f"  ready     curl -s {url}/v2/health/ready",
            f"  metadata  {curl} {url}/v2/models/{names[0]}",
            *_keys_line(keyed),
        ]
    name = service.registry.names()[0]
    meta = service.model_metadata(name)
    groups = service.registry.manifest.groups
    if groups:
        where = "the models in no group in-process; " + ", ".join(f"{g.name} in {g.workers} worker(s)" for g in groups)
    lines = [
        f"fnserve: {len(service.registry.names())} models on {url}, {where}; Ctrl-C stops.",
        f"  metadata  {curl} {url}/v2/models/{name}",
        f"  infer     {curl} {url}/v2/models/{name}/infer -d '{example_request(meta)}'",
        "  python    " + _triton_lines("tritonclient.http", f"{host}:{port}", name, meta, "binary_data=True", keyed),
    ]
    if settings.grpc_port is not None:
        address = f"{settings.grpc_host}:{settings.grpc_port}"
        lines.append(f"  gRPC      {address}: " + _triton_lines("tritonclient.grpc", address, name, meta, "", keyed))
    return lines + _keys_line(keyed)


def _keys_line(keyed: bool) -> list[str]:
    return (
        ["  keys      every route but the health checks needs one of the API keys: put yours for KEY"] if keyed else []
    )


def example_request(meta: dict[str, Any]) -> str:
    """A V2 request of zeros (or empty texts) for the model ``meta`` describes, one row, as compact JSON."""
    inputs = []
    for spec in meta["inputs"]:
        shape = _one_row(spec["shape"])
        size = math.prod(shape)
        value: object = "" if spec["datatype"] == "BYTES" else False if spec["datatype"] == "BOOL" else 0
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": [value] * size})
    return json.dumps({"inputs": inputs}, separators=(",", ":"))


def _triton_lines(module: str, address: str, name: str, meta: dict[str, Any], options: str, keyed: bool = False) -> str:
    """One line of Python that sends ``name`` a request of zeros with tritonclient's ``module`` (and an API key)."""
    key = ", headers={'authorization': 'Bearer KEY'}" if keyed else ""
    inputs = "; ".join(
        f"i{n} = t.InferInput('{spec['name']}', {_one_row(spec['shape'])}, '{spec['datatype']}'); "
        f"i{n}.set_data_from_numpy(np.zeros({_one_row(spec['shape'])}, '{_numpy_name(spec['datatype'])}')"
        f"{', ' + options if options else ''})"
        for n, spec in enumerate(meta["inputs"])
    )
    return (
        f"import numpy as np, {module} as t; c = t.InferenceServerClient('{address}'); "
        f"{inputs}; r = c.infer('{name}', [{', '.join(f'i{n}' for n in range(len(meta['inputs'])))}]"
        f"{key}); "
        "print(r.get_response())"
    )


def _one_row(shape: list[int]) -> list[int]:
    return [1 if d == -1 else d for d in shape]


def _numpy_name(datatype: str) -> str:
    from fnserve.core.models.datatypes import V2_TO_NUMPY

    return str(V2_TO_NUMPY[datatype])
