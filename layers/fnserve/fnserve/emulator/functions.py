"""The template's functions as the emulator runs them: worker specs, HTTP routes and SQS event sources.

Each function's environment is the template's (Globals, then its own), with references
resolved to the local resources and ``/opt/...`` paths mapped to its layers' folders (in
Lambda a layer's content lands under /opt; here it stays where it is), plus the caller's
``AWS_*`` variables so its clients reach the same endpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fnserve.emulator.auth import route_auth
from fnserve.emulator.gateway import HttpRoute
from fnserve.emulator.schedules import Schedule
from fnserve.emulator.sqs import SqsSource
from fnserve.emulator.template import Resolver, Template
from fnserve.workers.pool import FunctionSpec

# Event sources the emulator runs; any other is named in a warning at start, never skipped in silence.
EMULATED_EVENTS = ("HttpApi", "Api", "SQS", "Schedule", "ScheduleV2")


@dataclass
class Application:
    """What the template declares to run."""

    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    routes: list[HttpRoute] = field(default_factory=list)
    sources: list[SqsSource] = field(default_factory=list)
    schedules: list[Schedule] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the template declares that the emulator does not run
    layers: dict[str, list[Path]] = field(default_factory=dict)  # each function's layers' content folders


def collect(template: Template, resolver: Resolver, root: Path, workers: int) -> Application:
    """Every function of the template with its routes (SAM events and raw HTTP API routes) and event sources."""
    app = Application()
    layers = template.of_type("AWS::Serverless::LayerVersion")
    layer_roots = {name: root / layer["Properties"]["ContentUri"] for name, layer in layers.items()}
    for name, resource in template.of_type("AWS::Serverless::Function").items():
        if "Condition" in resource and not resolver.condition(resource["Condition"]):
            continue  # not deployed with these parameters (template.yaml's zip or image twin)
        props = resolver.resolve(template.properties(name))  # its Globals merged in, as SAM merges them
        variables = {k: str(v) for k, v in props.get("Environment", {}).get("Variables", {}).items()}
        aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        if props.get("PackageType") == "Image":  # paths are the image's own; started by local.images
            app.functions[name] = FunctionSpec(
                name=name,
                code_dir="",
                handler="",
                command=[str(arg) for arg in (props.get("ImageConfig") or {}).get("Command") or []],
                env=variables | aws,
                timeout=float(props.get("Timeout", 3)),
                memory_mb=int(props.get("MemorySize", 128)),
                image=str(props["ImageUri"]),
            )
        else:
            roots = [layer_roots[layer] for layer in props.get("Layers", []) if layer in layer_roots]
            app.layers[name] = roots
            env = {k: _opt(v, roots) for k, v in variables.items()} | aws
            env["FNSERVE_PARALLEL_WORKERS"] = str(workers)
            app.functions[name] = FunctionSpec(
                name=name,
                code_dir=str(root / props.get("CodeUri", ".")),
                handler=props.get("Handler", "app.handler"),
                env=env,
                timeout=float(props.get("Timeout", 3)),
                memory_mb=int(props.get("MemorySize", 128)),
                paths=_layer_paths(roots, str(props.get("Runtime", ""))),
                memory_limit=True,
            )
        for event_name, event in (props.get("Events") or {}).items():
            if event.get("Type") in EMULATED_EVENTS:
                _event(app, name, event_name, event, resolver)
            else:
                app.warnings.append(
                    f"function {name}: event {event_name} ({event.get('Type')}) is not emulated; only "
                    f"{', '.join(EMULATED_EVENTS)} events are. Deployed, it would invoke {name}."
                )
    # Routes to a function that does not run here (an image, or a condition's other twin) are not served.
    app.routes += [route for route in _raw_http_routes(template, resolver) if route.function in app.functions]
    return app


def _layer_paths(roots: list[Path], runtime: str) -> list[str]:
    """Where Lambda's Python finds a layer's modules: /opt/python/lib/pythonX.Y/site-packages, then /opt/python."""
    paths = []
    for root in roots:
        if runtime:
            paths.append(root / "python" / "lib" / runtime / "site-packages")
        paths.append(root / "python")
    return [str(path) for path in paths if path.is_dir()]


def _opt(value: str, layers: list[Path]) -> str:
    if value.startswith("/opt/"):
        for root in layers:
            candidate = root / value.removeprefix("/opt/")
            if candidate.exists():
                return str(candidate)
    return value


def _event(app: Application, function: str, name: str, event: dict[str, Any], resolver: Resolver) -> None:
    props = event.get("Properties", {})
    kind = event.get("Type")
    if kind in ("Schedule", "ScheduleV2"):
        v2 = kind == "ScheduleV2"
        state = str(props.get("State", "ENABLED")).upper()
        schedule = Schedule(
            function,
            name,
            str(props.get("ScheduleExpression" if v2 else "Schedule", "")),
            kind,
            enabled=state != "DISABLED" and props.get("Enabled", True) is not False,
            input=props.get("Input"),
            timezone=str(props.get("ScheduleExpressionTimezone", "UTC")) if v2 else "UTC",
        )
        if schedule.error is not None:
            app.warnings.append(
                f"function {function}: schedule {name} does not run on a timer here ({schedule.error}); "
                f"POST /_fnserve/schedules/{function}/{name} runs it"
            )
        app.schedules.append(schedule)
        return
    if kind in ("HttpApi", "Api"):
        method = str(props.get("Method", "ANY")).upper()
        version = "2.0" if kind == "HttpApi" else "1.0"
        app.routes.append(HttpRoute(method, props.get("Path", "/{proxy+}"), version, function))
    elif kind == "SQS":
        queue_arn = props["Queue"]
        by_arn = {a: resolver.physical[n] for (n, attribute), a in resolver.attributes.items() if attribute == "Arn"}
        url = by_arn.get(queue_arn)
        if url is None:
            raise ValueError(f"function {function}: queue {queue_arn} is not declared in the template")
        app.sources.append(
            SqsSource(
                function,
                url,
                queue_arn,
                int(props.get("BatchSize", 10)),
                float(props.get("MaximumBatchingWindowInSeconds", 0)),
                "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
            )
        )


def _raw_http_routes(template: Template, resolver: Resolver) -> list[HttpRoute]:
    """AWS::ApiGatewayV2 routes with AWS_PROXY integrations (HTTP APIs declared without SAM events)."""
    integrations = {}
    for name, resource in template.of_type("AWS::ApiGatewayV2::Integration").items():
        uri = resource["Properties"].get("IntegrationUri", {})
        while isinstance(uri, dict) and "Fn::If" in uri:  # a function chosen by a condition (its packaging)
            condition, chosen, other = uri["Fn::If"]
            uri = chosen if resolver.condition(condition) else other
        target = uri.get("Ref", "") if isinstance(uri, dict) else str(uri)
        function = target.split(".")[0]
        if function in template.resources:
            version = str(resource["Properties"].get("PayloadFormatVersion", "2.0"))
            integrations[name] = (function, version)
    authorizers = {
        name: resolver.resolve(resource["Properties"])
        for name, resource in template.of_type("AWS::ApiGatewayV2::Authorizer").items()
        if "Condition" not in resource or resolver.condition(resource["Condition"])
    }
    routes = []
    for resource in template.of_type("AWS::ApiGatewayV2::Route").values():
        props = resolver.resolve(resource["Properties"])
        target = str(props.get("Target", "")).removeprefix("integrations/")
        if target not in integrations:
            continue
        method, _, path = str(props["RouteKey"]).partition(" ")
        function, version = integrations[target]
        authorizer = authorizers.get(str(props.get("AuthorizerId", "")))
        auth = route_auth(str(props.get("AuthorizationType", "NONE")), authorizer)
        routes.append(HttpRoute(method.upper(), path, version, function, auth))
    return routes
