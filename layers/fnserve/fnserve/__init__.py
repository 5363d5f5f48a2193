"""fnserve: serverless inference for quantized ONNX models.

Importing ``fnserve`` (or a small submodule such as ``fnserve.aws.clients``) loads neither
numpy nor onnxruntime nor pydantic: the names below are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["FnserveError", "InferenceService", "__version__"]

if TYPE_CHECKING:
    from fnserve.core.errors import FnserveError
    from fnserve.core.execution.service import InferenceService


def __getattr__(name: str) -> Any:
    if name == "FnserveError":
        from fnserve.core.errors import FnserveError

        return FnserveError
    if name == "InferenceService":
        from fnserve.core.execution.service import InferenceService

        return InferenceService
    raise AttributeError(f"module 'fnserve' has no attribute {name!r}")
