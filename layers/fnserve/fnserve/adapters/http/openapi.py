"""OpenAPI documentation of the V2 routes (schemas after the Open Inference Protocol's spec).

The routes read raw bodies for speed, so their request and response shapes are declared
here rather than inferred from pydantic models.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_PARAMETERS = {"type": "object"}
_TENSOR_DATA: dict[str, Any] = {"type": "array", "items": {}}
_SHAPE = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_METADATA_TENSOR = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": _SHAPE | {"items": {"type": "integer"}},
    },
    "required": ["name", "datatype", "shape"],
}
DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]

INFERENCE_REQUEST = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "shape": _SHAPE,
                    "datatype": {"type": "string", "enum": DATATYPES},
                    "parameters": _PARAMETERS,
                    "data": _TENSOR_DATA,
                },
                "required": ["name", "shape", "datatype", "data"],
            },
        },
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS},
                "required": ["name"],
            },
        },
    },
    "required": ["inputs"],
}

INFERENCE_RESPONSE = {
    "type": "object",
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "shape": _SHAPE,
                    "datatype": {"type": "string"},
                    "parameters": _PARAMETERS,
                    "data": _TENSOR_DATA,
                },
                "required": ["name", "shape", "datatype"],
            },
        },
    },
    "required": ["model_name", "outputs"],
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS: dict[int | str, Any] = {
    404: _json(_ERROR, "Unknown model or version"),
}

LIVE: dict[int | str, Any] = {
    200: _json({"type": "object", "properties": {"live": {"type": "boolean"}}}, "Live"),
}
READY: dict[int | str, Any] = {
    200: _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "Every model can serve"),
    503: _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "Some model cannot serve"),
}
SERVER_METADATA: dict[int | str, Any] = {
    200: _json(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "version", "extensions"],
        },
        "Server metadata",
    )
}
# Where a model runs (in its metadata's parameters and its readiness).
_PLACEMENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "providers": {"type": "array", "items": {"type": "string"}, "description": "ONNX Runtime's providers"},
        "device": {"type": "string", "description": "cuda:N or cpu"},
        "cpu_fallback": {"type": "string", "description": "Why a GPU provider asked for is not in use"},
    },
}
MODEL_METADATA: dict[int | str, Any] = {
    200: _json(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _METADATA_TENSOR},
                "outputs": {"type": "array", "items": _METADATA_TENSOR},
                "parameters": _PLACEMENT,
            },
            "required": ["name", "platform"],
        },
        "Model metadata",
    ),
    **_ERRORS,
    503: _json(_ERROR, "The model cannot load"),
}
_MODEL_READY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}, **_PLACEMENT["properties"]},
}
MODEL_READY: dict[int | str, Any] = {
    200: _json(_MODEL_READY, "The model can serve"),
    503: _json(_MODEL_READY, "The model cannot serve"),
    **_ERRORS,
}

# Triton's statistics extension: counts and nanoseconds per stage, per model version.
_DURATION = {
    "type": "object",
    "properties": {"count": {"type": "integer", "minimum": 0}, "ns": {"type": "integer", "minimum": 0}},
    "required": ["count", "ns"],
}
_STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
_MODEL_STAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "last_inference": {"type": "integer", "description": "Milliseconds since the epoch; 0: none yet"},
        "inference_count": {"type": "integer", "description": "Rows run by the model (cache hits not included)"},
        "execution_count": {"type": "integer", "description": "Model runs: a batch of requests is one"},
        "inference_stats": {"type": "object", "properties": dict.fromkeys(_STAGES, _DURATION)},
        "batch_stats": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "batch_size": {"type": "integer"},
                    **dict.fromkeys(("compute_input", "compute_infer", "compute_output"), _DURATION),
                },
            },
        },
    },
    "required": ["name", "version", "inference_count", "execution_count", "inference_stats", "batch_stats"],
}
STATISTICS: dict[int | str, Any] = {
    200: _json(
        {"type": "object", "properties": {"model_stats": {"type": "array", "items": _MODEL_STAT}}},
        "Statistics of every model version asked for, since the server started (Triton's statistics extension)",
    ),
    **_ERRORS,
}
MODEL_CONFIG: dict[int | str, Any] = {
    200: _json(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "platform": {"type": "string"},
                "backend": {"type": "string"},
                "max_batch_size": {"type": "integer"},
                "input": {"type": "array", "items": {"type": "object"}},
                "output": {"type": "array", "items": {"type": "object"}},
                "dynamic_batching": {"type": "object"},
                "instance_group": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["name", "platform", "max_batch_size", "input", "output"],
        },
        "The model's configuration as Triton's model-configuration extension gives it",
    ),
    **_ERRORS,
    503: _json(_ERROR, "The model cannot load"),
}


def infer(versioned: bool) -> dict[str, Any]:
    """Route documentation for infer; its path parameters are declared here, not as arguments."""
    names = ["name", "version"] if versioned else ["name"]
    doc = {**_INFER, "openapi_extra": {**_INFER["openapi_extra"]}}
    doc["openapi_extra"]["parameters"] = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]
    return doc


_INFER: dict[str, Any] = {
    "responses": {
        200: {
            "description": "Inference result (application/octet-stream when binary tensors follow the JSON)",
            "content": {
                "application/json": {"schema": INFERENCE_RESPONSE},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        400: _json(_ERROR, "Malformed request"),
        **_ERRORS,
        413: _json(_ERROR, "Request body over the size limit"),
        422: _json(_ERROR, "Tensors that do not fit the model"),
        503: _json(_ERROR, "The model cannot load"),
    },
    "openapi_extra": {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": INFERENCE_REQUEST},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
}

RESULT: dict[int | str, Any] = {
    200: _json(
        {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "status": {"type": "string", "enum": ["pending", "done", "skipped", "failed"]},
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "parameters": {
                    "type": "object",
                    "properties": {"answered_by": {"type": "string", "description": "The model that computed it"}},
                },
                "outputs": INFERENCE_RESPONSE["properties"]["outputs"],  # type: ignore[index]
                "error": {"type": "string"},
            },
            "required": ["id", "status"],
        },
        "The result, or its status while it is not there yet",
    ),
    400: _json(_ERROR, "A bad 'wait'"),
    404: _json(_ERROR, "No such result"),
}

PING: dict[int | str, Any] = {
    200: _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "Every model is loaded and warm"),
    503: _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "Not every model can serve yet"),
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
INVOCATIONS: dict[str, Any] = {
    "summary": "SageMaker's inference route",
    "description": "A V2 request (JSON or the binary tensor extension), a .npy array (the model's one input) or a "
    ".npz of arrays by input name, for the model named by X-Amzn-SageMaker-Target-Model or 'model=NAME' in "
    "X-Amzn-SageMaker-Custom-Attributes (else FNSERVE_DEFAULT_MODEL, else the only one). Accept "
    "application/x-npy or application/x-npz for NumPy answers.",
    "responses": {
        200: {
            "description": "Inference result",
            "content": {
                "application/json": {"schema": INFERENCE_RESPONSE},
                "application/octet-stream": _BINARY,
                "application/x-npy": _BINARY,
                "application/x-npz": _BINARY,
            },
        },
        **{code: doc for code, doc in _INFER["responses"].items() if code != 200},
    },
    "openapi_extra": {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": INFERENCE_REQUEST},
                "application/octet-stream": _BINARY,
                "application/x-npy": _BINARY,
                "application/x-npz": _BINARY,
            },
        }
    },
}


INFER = infer(versioned=False)
INFER_VERSIONED = infer(versioned=True)
