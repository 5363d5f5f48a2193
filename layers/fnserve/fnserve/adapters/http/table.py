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


def _tei_routes(prefix: str) -> tuple[Route, ...]:
    posts = ("embed", "rerank", "predict", "tokenize")
    roots = (f"{prefix}", f"{prefix}/") if prefix else ("/",)  # a base URL given with its slash or without
    return (
        *(Route("POST", root, "tei.root", schema=False, fast=True) for root in roots),
        *(Route("POST", f"{prefix}/{name}", f"tei.{name}", schema=False, fast=True) for name in posts),
        Route("GET", f"{prefix}/info", "tei.info", schema=False, fast=True),
        Route("GET", f"{prefix}/health", "tei.health", schema=False, fast=True),
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
    # text-embeddings-inference's own API: the server's TEI model at the root, as a TEI server serves its one
    # model, and every pipeline of a kind TEI serves under /tei/{model}.
    *_tei_routes(""),
    *_tei_routes("/tei/{model}"),
    Route("GET", "/metrics", "metrics.scrape", schema=False, gateway=False),
)

# The JSON APIs' groups: the module and class of each one's routes, made when one is first called.
JSON_APIS: dict[str, tuple[str, str]] = {
    "openai": ("fnserve.adapters.http.openai", "OpenAIRoutes"),
    "rerank": ("fnserve.adapters.http.rerank", "RerankRoutes"),
    "tei": ("fnserve.adapters.http.tei", "TEIRoutes"),
}

# What V2App answers before FastAPI: the routes without parameters by (method, path), then the others by their
# segments; inference's two patterns are read from the path itself first (the hot road).
_FAST_PATHS: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in ROUTES if r.fast and "{" not in r.path}
_FAST_PATTERNS: tuple[tuple[str, tuple[str, ...], Route], ...] = tuple(
    (r.method, tuple(r.path.split("/")), r) for r in ROUTES if r.fast and "{" in r.path and r.endpoint != "v2.infer"
)


_PATHS: dict[tuple[str, str], Route] = {(r.method, r.path): r for r in reversed(ROUTES) if "{" not in r.path}
_PATTERNS: tuple[tuple[str, tuple[str, ...], Route], ...] = tuple(
    (r.method, tuple(r.path.split("/")), r) for r in ROUTES if "{" in r.path
)


def route_of(method: str, path: str) -> Route | None:
    """The route of the table that answers ``method`` on ``path`` (HEAD as GET), fast or not; None: no route."""
    method = "GET" if method == "HEAD" else method
    route = _PATHS.get((method, path))
    if route is not None:
        return route
    parts = path.split("/")
    return next((r for m, segments, r in _PATTERNS if m == method and _matched(segments, parts) is not None), None)


def fast_route(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The fast route that answers ``method`` on ``path``, and its path parameters; None: FastAPI answers."""
    route = _FAST_PATHS.get((method, path))
    if route is not None:
        return route, {}
    parts = path.split("/")
    for wanted, segments, route in _FAST_PATTERNS:
        if wanted == method:
            found = _matched(segments, parts)
            if found is not None:
                return route, found
    return None


def _matched(segments: tuple[str, ...], parts: list[str]) -> dict[str, str] | None:
    found: dict[str, str] = {}
    for i, segment in enumerate(segments):
        if segment.endswith(":path}"):  # the rest of the path, slashes and all
            rest = "/".join(parts[i:])
            if not rest:
                return None
            found[segment[1:].partition(":")[0]] = rest
            return found
        if i >= len(parts):
            return None
        if segment.startswith("{"):
            if not parts[i]:
                return None
            found[segment[1:-1]] = parts[i]
        elif segment != parts[i]:
            return None
    return found if len(parts) == len(segments) else None
