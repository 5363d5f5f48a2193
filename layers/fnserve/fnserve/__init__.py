"""fnserve: serverless inference for quantized ONNX models."""

from fnserve.core.errors import FnserveError
from fnserve.core.service import InferenceService

__all__ = ["FnserveError", "InferenceService", "__version__"]
__version__ = "0.1.0"
