"""`fnserve local`: run a SAM template's functions on a laptop, no Docker, with Lambda's concurrency model.

- AWS: an embedded moto server on 127.0.0.1 (or ``AWS_ENDPOINT_URL`` / LocalStack when set),
  holding the template's queues (with their redrive policies), tables and buckets.
- Functions: each in its own :class:`~fnserve.workers.pool.WorkerPool` of warm workers, with
  the template's environment, timeout and memory.
- HTTP: a gateway turns each request into the API Gateway event its route declares (v2 for
  HTTP APIs, v1 for REST APIs) and the response back into HTTP.
- SQS: pollers feed each event source's batches to its function, as the event source mapping does.
- Schedules: ``Schedule`` and ``ScheduleV2`` events invoke their function when due
  (:mod:`fnserve.emulator.schedules`), or at once on ``POST /_fnserve/schedules/{function}/{event}``.
- ``reload``: a change to a function's code, its layers or the files its environment names (the
  model manifest and the models beside it) replaces that function's workers once each is idle, as
  a new deployment would: the next invocation is a cold start with the new code.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fnserve.aws import clients
from fnserve.emulator.functions import Application, collect
from fnserve.emulator.gateway import HttpRoute, gateway_app
from fnserve.emulator.resources import create_resources, start_aws
from fnserve.emulator.sqs import Poller, SqsSource
from fnserve.emulator.template import Resolver, Template, load_template
from fnserve.observability.logs import logger
from fnserve.workers.pool import FunctionSpec, Observer, Pool, WorkerPool


@dataclass
class Local:
    """What the emulator runs, for the banner and for tests (GET /_fnserve/local)."""

    endpoint: str
    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    queues: dict[str, str] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)
    buckets: dict[str, str] = field(default_factory=dict)


class Emulator:
    def __init__(
        self,
        template: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 3000,
        workers: int = 1,
        visibility_timeout: int | None = None,
        parameters: dict[str, str] | None = None,
        observer: Observer | None = None,
        reload: bool = False,
        manifest: Path | None = None,
    ) -> None:
        self.template: Template = load_template(template)
        self.manifest = manifest.resolve() if manifest is not None else None  # in place of the models layer's
        self.template_path = template.resolve()
        self.reload = reload
        self.root = template.resolve().parent
        self.host, self.port, self.workers = host, port, workers
        self.visibility_timeout = visibility_timeout
        self.parameters = parameters or {}
        self.observer = observer  # the console: each invocation's START/END/REPORT and its function's output
        self.pools: dict[str, Pool] = {}
        self.app = Application()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._moto: Any = None
        self._server: Any = None
        self.local: Local | None = None

    @property
    def routes(self) -> list[HttpRoute]:
        return self.app.routes

    @property
    def sources(self) -> list[SqsSource]:
        return self.app.sources

    def start(self) -> Local:
        """Start everything; if any part cannot start (a function whose init fails, say), stop the rest."""
        from fnserve.server.starting import refuse_taken

        refuse_taken(self.host, self.port, "the gateway's")  # at once, not after every function has started
        try:
            # The AWS emulator beside the gateway (3001 for 3000): the queue URLs printed stay the same across starts.
            endpoint, self._moto = start_aws(self.port + 1 if self.port else None)
            physical, attributes = create_resources(self.template, self.parameters, self.visibility_timeout)
            self.app = collect(
                self.template, Resolver(self.template, physical, attributes, self.parameters), self.root, self.workers
            )
            if self.manifest is not None:  # every function that reads a manifest reads this one
                for spec in self.app.functions.values():
                    if "FNSERVE_MANIFEST" in spec.env and not spec.image:
                        spec.env["FNSERVE_MANIFEST"] = str(self.manifest)
            self.local = Local(endpoint, self.app.functions, *self._resources(physical))
            self._check_visibility()
            for name, spec in self.app.functions.items():
                spec = dataclasses.replace(spec, console=self.observer is not None)
                if spec.image:  # a container image function: its containers, on a Runtime API each
                    from fnserve.emulator.images import ImagePool

                    self.pools[name] = ImagePool(spec, self.workers, self.observer).start()
                else:
                    self.pools[name] = WorkerPool(spec, self.workers, self.observer).start()
            for source in self.app.sources:
                for n in range(self.workers):  # one poller per worker: batches run concurrently, as on AWS
                    poller = Poller(source, self.pools[source.function], self._stop)
                    self._thread(poller.run, name=f"sqs-{source.function}-{n}")
            if self.app.schedules:
                self._thread(self._run_schedules, name="schedules")
            if self.reload:
                self._thread(self._watch, name="reload")
            self._serve()
        except BaseException:
            self.stop()
            raise
        return self.local

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        for thread in self._threads:
            thread.join(timeout=30)
        for pool in self.pools.values():
            pool.close()
        if self._moto is not None:
            self._moto.stop()

    def _resources(self, physical: dict[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """Queue URLs, table names and bucket names by logical id."""
        kinds = ("AWS::SQS::Queue", "AWS::DynamoDB::Table", "AWS::S3::Bucket")
        queues, tables, buckets = ({name: physical[name] for name in self.template.of_type(k)} for k in kinds)
        return queues, tables, buckets

    def _thread(self, target: Callable[[], None], *, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _run_schedules(self) -> None:
        """Invoke each schedule's function when it is due, as EventBridge invokes it (asynchronously: the
        outcome shows on the console, as it would in the function's log)."""
        due = [s.next_after(datetime.now(UTC)) for s in self.app.schedules]
        while True:
            pending = [(when, i) for i, when in enumerate(due) if when is not None]
            if not pending:
                return
            when, index = min(pending)
            if self._stop.wait(max(0.0, (when - datetime.now(UTC)).total_seconds())):
                return
            schedule = self.app.schedules[index]
            self.pools[schedule.function].invoke(schedule.payload(when))
            # From now if it ran late (a laptop asleep): missed times are skipped, as EventBridge skips them.
            due[index] = schedule.next_after(max(when, datetime.now(UTC)))

    def watched(self) -> dict[str, list[Path]]:
        """The folders whose changes restart each function: its code, its layers, and the folders of the
        project's files its environment names (a model manifest and its models)."""
        watched = {}
        for name, spec in self.app.functions.items():
            if spec.image:
                continue  # an image changes only with a new image
            roots = [Path(spec.code_dir), *self.app.layers.get(name, [])]
            named = (Path(v) for v in spec.env.values() if v.startswith("/"))
            roots += [f.parent for f in named if f.is_file() and f.resolve().is_relative_to(self.root)]
            watched[name] = list(dict.fromkeys(r.resolve() for r in roots))
        return watched

    def watch_roots(self) -> list[Path]:
        """Every function's watched folders, without those inside another."""
        roots = sorted({r for rs in self.watched().values() for r in rs})
        return [r for r in roots if not any(r != o and r.is_relative_to(o) for o in roots)]

    def _watch(self) -> None:
        from watchfiles import watch

        watched, roots = self.watched(), [*self.watch_roots(), self.template_path]
        for changes in watch(*roots, watch_filter=reload_filter(), stop_event=self._stop, raise_interrupt=False):
            changed = sorted({Path(path) for _, path in changes})
            if self.template_path in changed:
                logger.warning(
                    "%s changed: restart fnserve local to apply it (routes, queues and environments are read at start)",
                    self.template_path.name,
                )
            for name, pool in self.pools.items():
                hit = [c for c in changed if any(c.is_relative_to(r) for r in watched[name])]
                if hit:
                    more = f" and {len(hit) - 1} more" if len(hit) > 1 else ""
                    where = hit[0].relative_to(self.root) if hit[0].is_relative_to(self.root) else hit[0]
                    logger.info("reload: %s%s changed; %s starts new workers", where, more, name)
                    pool.recycle()

    def _check_visibility(self) -> None:
        """Warn where messages would reappear while their batch is still being gathered or run."""
        sqs = clients.client("sqs")
        for source in self.app.sources:
            attributes = sqs.get_queue_attributes(QueueUrl=source.queue_url, AttributeNames=["VisibilityTimeout"])
            visible_after = int(attributes["Attributes"]["VisibilityTimeout"])
            needed = source.window + self.app.functions[source.function].timeout
            if visible_after < needed:
                logger.warning(
                    "queue of %s: visibility timeout %ss is under the batching window plus the function timeout "
                    "(%gs): messages will reappear while their batch runs (AWS advises 6x the timeout + the window)",
                    source.function,
                    visible_after,
                    needed,
                )

    def _serve(self) -> None:
        import uvicorn

        app = gateway_app(self.app.routes, self.pools, self._info, self.app.schedules)
        config = uvicorn.Config(
            app, host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        thread = self._thread(self._server.run, name="gateway")
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the gateway could not listen on {self.host}:{self.port}")
            time.sleep(0.02)

    async def _info(self) -> dict[str, Any]:
        assert self.local is not None
        return {
            "endpoint": self.local.endpoint,
            "queues": self.local.queues,
            "tables": self.local.tables,
            "buckets": self.local.buckets,
            "functions": {name: pool.worker_pids() for name, pool in self.pools.items()},
            "routes": [f"{r.method} {r.path} -> {r.function} ({r.version})" for r in self.app.routes],
            "schedules": [f"{s.expression} -> {s.function} ({s.event})" for s in self.app.schedules],
        }


def reload_filter() -> Callable[[Any, str], bool]:
    """watchfiles' default filter, and hidden files too: an editor's swap file, or the temporary manifest
    ``fnserve manifest add`` checks before it replaces the real one, are not what a reload line should name."""
    from watchfiles import DefaultFilter

    return DefaultFilter(ignore_entity_patterns=(*DefaultFilter.ignore_entity_patterns, r"^\."))
