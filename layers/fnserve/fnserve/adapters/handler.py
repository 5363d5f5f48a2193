"""The handler base: what the Lambda and Cloud Functions handlers share, so each of their modules only translates.

Once per process, at import of the function's entry file (warm globals), a handler starts with
:func:`start_requests` (the API and HTTP functions: a data plane) or :func:`start_jobs` (the SQS
and Pub/Sub functions: a job processor): the settings are read, the objects built from them
(:mod:`fnserve.bootstrap`), the platform's own steps run around that (``prepare`` before anything
is built or logged: Cloud Logging's line shape; ``ready`` once the models are known: SnapStart's
hooks) and tracing is configured.

Per invocation, a Lambda handler is its translation wrapped by :func:`lambda_handler`: each
invocation's log lines carry its context, and before it returns, what it buffered and then its
spans are written out, since Lambda freezes the process between invocations, the span
exporter's thread with it (docs/design/handlers.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fnserve import bootstrap
from fnserve.core.execution.deadline import DEADLINE, Deadline
from fnserve.observability import logs, tracing
from fnserve.observability.logs import logger
from fnserve.settings import Settings

if TYPE_CHECKING:
    from fnserve.core.execution.service import InferenceService
    from fnserve.core.jobs.processor import JobProcessor
    from fnserve.core.jobs.results import ResultStore
    from fnserve.core.models.registry import ModelRegistry
    from fnserve.core.serving.dataplane import DataPlane

Answer = TypeVar("Answer")
Translate = Callable[[dict[str, Any], Any], Answer]  # a Lambda event and its context -> the answer


def start_requests(
    settings: Settings | None,
    service: InferenceService | None,
    *,
    concurrent: bool = False,
    prepare: Callable[[], None] | None = None,
    ready: Callable[[ModelRegistry], None] | None = None,
) -> tuple[Settings, DataPlane]:
    """The settings and data plane of a function that answers requests, its result store bounded by the
    request budget; ``concurrent``: one process answers several requests at once."""
    settings = settings or Settings()
    if prepare is not None:
        prepare()
    store = bootstrap.result_store(settings, for_requests=True)
    service = service or bootstrap.build_service(settings, store)
    # Concurrent requests: calls that leave the process (the store, follow-ups) wait in threads, not on the loop.
    offload = concurrent and (store is not None or bool(service.registry.manifest.cascades))
    plane = bootstrap.build_dataplane(settings, service=service, store=store, offload=offload)
    _ready(plane.service.registry, ready)
    return settings, plane


def start_jobs(
    settings: Settings | None,
    service: InferenceService | None,
    store: ResultStore | None,
    *,
    prepare: Callable[[], None] | None = None,
    ready: Callable[[ModelRegistry], None] | None = None,
) -> tuple[Settings, JobProcessor]:
    """The settings and job processor of a batch function (with the configured store unless ``store``)."""
    settings = settings or Settings()
    if prepare is not None:
        prepare()
    # As the HTTP functions' app does (create_app): FNSERVE_LOG_LEVEL, else Powertools' and Lambda's variables.
    logger.setLevel(logs.level(settings.log_level if "log_level" in settings.fields_set else None))
    processor = bootstrap.batch_processor(settings, service, store)
    _ready(processor.service.registry, ready)
    return settings, processor


def _ready(registry: ModelRegistry, ready: Callable[[ModelRegistry], None] | None) -> None:
    if ready is not None:
        ready(registry)
    tracing.configure()


# What an invocation keeps of its remaining time (its answer written out, its buffers flushed), or this share of it
# where that is less.
INVOCATION_RESERVE_SECONDS = 1.0
INVOCATION_RESERVE_SHARE = 0.1
# API Gateway's integration timeout (REST APIs: 29 s; HTTP APIs: 30 s): past it the caller has a 504 and nobody
# reads the answer, however long the function may still run.
API_GATEWAY_SECONDS = 29.0


def invocation_deadline(event: Any, context: Any) -> Deadline | None:
    """When an invocation's answer stops being of use: its remaining time (less what writing it out takes), or
    API Gateway's timeout for an event it sent, if sooner; None where the context does not say."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return None
    seconds = remaining() / 1000
    reserve = min(INVOCATION_RESERVE_SECONDS, INVOCATION_RESERVE_SHARE * seconds)
    deadline = Deadline(time.monotonic() + seconds - reserve, "the function's remaining time")
    request = event.get("requestContext") if isinstance(event, dict) else None
    if isinstance(request, dict) and "apiId" in request and "lambda-url" not in str(request.get("domainName", "")):
        gateway = Deadline(time.monotonic() + API_GATEWAY_SECONDS, f"API Gateway's {API_GATEWAY_SECONDS:g} s")
        deadline = min(deadline, gateway, key=lambda d: d.at)
    return deadline


def lambda_handler(translate: Translate[Answer], *buffers: Callable[[], None]) -> Translate[Answer]:
    """The Lambda handler around ``translate`` (an event and its context in, the answer out): each invocation's log
    lines carry its context and none of the last one's keys (Powertools), its deadline is what its runs foresee
    against (:func:`invocation_deadline`), and as it ends, raising or not, what it buffered is written out
    (``buffers``, then the spans)."""
    flushes = (*buffers, tracing.flush)

    @logger.inject_lambda_context(clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> Answer:
        token = DEADLINE.set(invocation_deadline(event, context))
        try:
            return translate(event, context)
        finally:
            DEADLINE.reset(token)
            for flush in flushes:
                flush()

    return handler
