"""The V2 API's routes on FastAPI: health, metadata, results, inference's documented road, OpenAPI; each added from
the route table (:mod:`fnserve.adapters.http.table`) with its OpenAPI parts, its handler found here by name.

Built by :class:`~fnserve.adapters.http.infer.V2App` when a request first needs it (or in a thread, once a
server answers), so neither a Lambda container's first inference nor a server's first answer waits for FastAPI.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from fnserve import __version__
from fnserve.adapters.http import openapi
from fnserve.adapters.http.infer import InferenceRoute, JSONRoutes, V2Request, json_apis, responded
from fnserve.adapters.http.middleware import RequestContext, install_error_handlers, json_response
from fnserve.adapters.http.sagemaker import SageMakerRoutes
from fnserve.adapters.http.table import ROUTES
from fnserve.core.codec.tensors import JSON_HEADER, json_tensor
from fnserve.core.jobs.followups import ResultState
from fnserve.observability.envelope import EXTENSIONS

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def build(
    inference: InferenceRoute,
    metrics: Callable[[], bytes] | None = None,
    apis: Mapping[str, Callable[[], JSONRoutes]] | None = None,
) -> FastAPI:
    """The FastAPI app over ``inference``'s data plane (its lifespan is :class:`V2App`'s); ``metrics``: ``GET
    /metrics``; ``apis``: the JSON APIs' routes by the table's group (V2App's), each made when first called."""
    app = FastAPI(
        title="fnserve",
        version=__version__,
        description="Open Inference Protocol V2 (REST) with Triton's binary tensor extension.",
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(RequestContext)
    install_error_handlers(app)
    apis = apis or json_apis(inference)

    async def scrape() -> Response:
        assert metrics is not None
        return Response(metrics(), media_type=PROMETHEUS_TEXT)

    groups: dict[str, object] = {
        "v2": V2Routes(inference),
        "sagemaker": SageMakerRoutes(inference),
        "metrics": types.SimpleNamespace(scrape=scrape),
    }
    for route in ROUTES:
        if route.group == "metrics" and metrics is None:
            continue
        spec = getattr(openapi, route.spec) if route.spec else {}
        arguments = spec if "responses" in spec else {"responses": spec} if spec else {}
        tags: list[str | Enum] = list(route.tags)
        if route.group in apis:  # raw Starlette endpoints: the request itself, no parameters parsed
            endpoint = _json_endpoint(apis[route.group], route.attribute)
            app.router.add_route(route.path, endpoint, methods=[route.method], include_in_schema=route.schema)
        else:
            endpoint = getattr(groups[route.group], route.attribute)
            app.add_api_route(
                route.path, endpoint, methods=[route.method], tags=tags, include_in_schema=route.schema, **arguments
            )
    return app


def _json_endpoint(api: Callable[[], JSONRoutes], attribute: str) -> Callable[[Request], Awaitable[Response]]:
    """A JSON API's route as a Starlette endpoint (under a root_path, where FastAPI routes every request)."""

    async def endpoint(request: Request) -> Response:
        route = getattr(api(), attribute)
        return await responded(request, lambda send: route(request.scope, request.receive, send, **request.path_params))

    return endpoint


class V2Routes:
    """The FastAPI routes of the V2 API over one data plane."""

    def __init__(self, inference: InferenceRoute) -> None:
        self.inference = inference
        self.plane = inference.plane

    async def infer(self, request: Request) -> Response:
        """Inference under a ``root_path`` (V2App answers every other inference request before FastAPI)."""
        # Path parameters read directly: FastAPI's per-parameter validation costs more than the model.
        headers = request.headers
        v2 = V2Request(
            request.path_params["name"],
            request.path_params.get("version"),
            headers.get("traceparent"),
            request.receive,
            headers.get("content-length"),
            self.inference.limit,
            headers.get(JSON_HEADER),
            headers.get("content-encoding"),
        )
        payload, media_type, extra = await self.inference.answer(v2, accept=headers.get("accept-encoding"))
        return Response(payload, media_type=media_type, headers=extra)

    async def live(self) -> Response:
        return json_response({"live": True})

    async def ready(self) -> Response:
        is_ready = self.plane.catalog.ready()
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    async def server_metadata(self) -> Response:
        return json_response({"name": "fnserve", "version": __version__, "extensions": EXTENSIONS})

    async def model_metadata(self, name: str, version: str | None = None) -> Response:
        return json_response(self.plane.catalog.metadata(name, version))

    async def model_ready(self, name: str, version: str | None = None) -> Response:
        is_ready = self.plane.catalog.model_ready(name, version)
        body: dict[str, object] = {"name": name, "ready": is_ready}
        if is_ready:  # where it runs: its providers and device (and a CPU fall back's reason)
            body.update(self.plane.catalog.metadata(name, version).get("parameters", {}))
        return json_response(body, 200 if is_ready else 503)

    async def model_config(self, name: str, version: str | None = None) -> Response:
        return json_response(self.plane.catalog.config(name, version))

    async def statistics(self, name: str | None = None, version: str | None = None) -> Response:
        return json_response({"model_stats": self.plane.catalog.model_statistics(name, version)})

    async def result(
        self,
        result_id: str,
        wait: Annotated[
            float, Query(ge=0, description="Seconds to long-poll while pending; at most FNSERVE_MAX_WAIT_SECONDS.")
        ] = 0.0,
    ) -> Response:
        """A stored result (cascade follow-up or batch job); ``wait`` long-polls for it."""
        state = await self.plane.result(result_id, min(wait, self.inference.max_wait))
        return json_response(_result_document(state))


def _result_document(state: ResultState) -> dict[str, object]:
    doc: dict[str, object] = {"id": state.id, "status": state.state, "model_name": state.model}
    record = state.record
    if record is None:
        return doc
    if record.version:
        doc["model_version"] = record.version
    if record.answered_by:  # the model that computed it, where the job called a pipeline or a cascade
        doc["parameters"] = {"answered_by": record.answered_by}
    if record.status == "done":
        doc["outputs"] = [json_tensor(name, array) for name, array in record.outputs().items()]
    elif record.error:
        doc["error"] = record.error
    return doc
