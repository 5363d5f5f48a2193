"""One start taken step by step in a fresh process: what each phase on the path to the first answer costs.

    python tests/bench/start_phases.py api|batch EVENT MODEL[,MODEL]   (bench_start runs it, in the function's env)
    python tests/bench/start_phases.py serve - MODEL[,PIPELINE]

fnserve's own functions are called in the order a start calls them, each step timed: the settings, the manifest,
the other imports, the handler (or the server's service and app) built, each model's session, its warm-up, and
for a Lambda function the first event through the handler. FNSERVE_MANIFEST must name a manifest whose models
have ``warmup = false``, so that the session and its warm-up are timed apart (a start with warm-up on does both in
one call). Prints one line, ``phases {json}``: the step's name -> seconds, in the order they ran.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import types
from collections.abc import Callable
from typing import Any

clock = time.perf_counter
phases: dict[str, float] = {}
began = clock()


def done(phase: str) -> None:
    """The time since the last step, as ``phase``."""
    global began
    phases[phase] = clock() - began
    began = clock()


def capture_registry() -> list[Any]:
    """The handler's registry, as the SnapStart runtime is given it (its before-snapshot hook is the registry's
    ``warm_all``): a Lambda handler keeps its registry to itself."""
    registries: list[Any] = []
    runtime = types.ModuleType("snapshot_restore_py")
    runtime.register_before_snapshot = lambda hook: registries.append(hook.__self__)  # type: ignore[attr-defined]
    runtime.register_after_restore = lambda hook: None  # type: ignore[attr-defined]
    sys.modules["snapshot_restore_py"] = runtime
    return registries


def warm(registry: Any, names: list[str]) -> None:
    from fnserve.core.models.registry import warm_up

    for name in names:
        model = registry.get(name)
        warm_up(model.session, model.settings, model.inputs, model.output_names, model.placement, name)


def lambda_function(kind: str, event_path: str, models: list[str]) -> None:
    registries = capture_registry()
    adapter = importlib.import_module(f"fnserve.adapters.lambda_.{'http' if kind == 'api' else 'sqs'}")
    from fnserve.aws.events import LambdaContext

    done("imports: the handler's modules")
    handler: Callable[[dict[str, Any], Any], Any] = adapter.create_handler()
    done("handler built: store, registry, data plane (no model loaded)")
    registry = registries[0]
    for name in models:
        registry.get(name)
    done("session: read, sha256, InferenceSession")
    warm(registry, models)
    done("warm-up: a run on zeros")
    with open(event_path) as file:
        event = json.load(file)
    answer = handler(event, LambdaContext(function_name="start"))
    done("first request: the handler on the event")
    ok = answer.get("statusCode") == 200 if kind == "api" else answer == {"batchItemFailures": []}
    assert ok, answer


def server(model: str, pipeline: str | None) -> None:
    # What the process that serves runs from.
    import fnserve.server.serve  # noqa: F401
    from fnserve import bootstrap
    from fnserve.server.app import server_app

    done("imports: the server's modules (serve, app, bootstrap)")
    service = bootstrap.build_service(settings)
    done("service built: registry (no model loaded)")
    service.registry.get(model)
    done("session: read, sha256, InferenceSession")
    warm(service.registry, [model])
    done("warm-up: a run on zeros")
    if pipeline is not None:
        service.servable(pipeline)
        done("pipeline built: its tokenizer")
    server_app(settings, None, service)
    done("app built: data plane, batchers")


kind, event_path, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
# Timed from here: every import of fnserve comes after the clock starts.
from fnserve.settings import Settings  # noqa: E402

settings = Settings()
done("settings: import fnserve.settings, read FNSERVE_*")
from fnserve.core.models.manifest import load_manifest  # noqa: E402

load_manifest(settings.manifest)
done("manifest: import, parse, validate")
if kind == "serve":
    server(names[0], names[1] if len(names) > 1 else None)
else:
    lambda_function(kind, event_path, names)
print("phases", json.dumps(phases), flush=True)
