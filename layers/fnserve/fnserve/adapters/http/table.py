"""Every HTTP route fnserve answers, declared once.

The FastAPI app adds each of them from here with its OpenAPI parts (:func:`fnserve.adapters.http.routes.build`);
:class:`~fnserve.adapters.http.infer.V2App` answers those marked ``fast`` itself, as plain ASGI, before FastAPI is
built (outside a ``root_path``); template.yaml's API routes those marked ``gateway``, and its tests hold it to that.
A new API is a row here and its handler, not an edit in three routers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    """One route: ``endpoint`` names its handler as ``group.attribute`` (``v2.infer``: :class:`V2Routes`'s)."""

    method: str
    path: str  # FastAPI's pattern: ``{name}``, ``{model:path}``
    endpoint: str
    tags: tuple[str, ...] = ()
    # Its OpenAPI parts: an attribute of fnserve.adapters.http.openapi, read when FastAPI is built (not at a cold
    # start's first inference), its responses or FastAPI's route arguments whole.
    spec: str = ""
    schema: bool = True  # in the OpenAPI document
    fast: bool = False  # answered before FastAPI, outside a root_path
    gateway: bool = True  # routed by template.yaml's API (SageMaker's and the scrape's are not)

    @property
    def group(self) -> str:
        return self.endpoint.partition(".")[0]

    @property
    def attribute(self) -> str:
        return self.endpoint.partition(".")[2]


def _model_routes(prefix: str) -> tuple[Route, ...]:
    return (
        Route("GET", prefix, "v2.model_metadata", ("metadata",), "MODEL_METADATA"),
        Route("GET", f"{prefix}/ready", "v2.model_ready", ("health",), "MODEL_READY"),
        Route("GET", f"{prefix}/config", "v2.model_config", ("metadata",), "MODEL_CONFIG"),
        Route("GET", f"{prefix}/stats", "v2.statistics", ("statistics",), "STATISTICS"),
    )


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v2/models/{name}/infer", "v2.infer", ("inference",), "INFER", fast=True),
    Route(
        "POST",
        "/v2/models/{name}/versions/{version}/infer",
        "v2.infer",
        ("inference",),
        "INFER_VERSIONED",
        fast=True,
    ),
    Route("GET", "/v2/health/live", "v2.live", ("health",), "LIVE", fast=True),
    Route("GET", "/v2/health/ready", "v2.ready", ("health",), "READY", fast=True),
    Route("GET", "/v2", "v2.server_metadata", ("metadata",), "SERVER_METADATA"),
    Route("GET", "/v2/", "v2.server_metadata", schema=False, gateway=False),  # the API routes /v2 itself
    Route("GET", "/v2/models/stats", "v2.statistics", ("statistics",), "STATISTICS"),
    *_model_routes("/v2/models/{name}"),
    *_model_routes("/v2/models/{name}/versions/{version}"),
    Route("GET", "/v2/results/{result_id}", "v2.result", ("results",), "RESULT"),
    # SageMaker's hosting contract, beside the V2 routes: its container's own, never behind the API.
    Route("GET", "/ping", "sagemaker.ping", ("sagemaker",), "PING", fast=True, gateway=False),
    Route("POST", "/invocations", "sagemaker.invocations", ("sagemaker",), "INVOCATIONS", gateway=False),
    # OpenAI's embeddings API, documented on its own page (docs/embeddings.md), not in the V2 document.
    Route("POST", "/v1/embeddings", "openai.embeddings", schema=False, fast=True),
    Route("GET", "/v1/models", "openai.models", schema=False, fast=True),
    Route("GET", "/v1/models/{model:path}", "openai.models", schema=False, fast=True),
    # Cohere's rerank API (v1 and v2: the cohere client's Client and ClientV2), on its own page likewise.
    Route("POST", "/v1/rerank", "rerank.rerank", schema=False, fast=True),
    Route("POST", "/v2/rerank", "rerank.rerank", schema=False, fast=True),
    Route("GET", "/metrics", "metrics.scrape", schema=False, gateway=False),
)

# What V2App answers before FastAPI: the routes without parameters by (method, path), then those that end in a
# ``{...:path}`` parameter by their prefix; inference's two patterns are read from the path itself (the hot road).
FAST_PATHS: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in ROUTES if r.fast and "{" not in r.path}
FAST_PREFIXES: tuple[tuple[str, str, Route], ...] = tuple(
    (r.method, r.path.partition("{")[0], r) for r in ROUTES if r.fast and r.path.endswith(":path}")
)
