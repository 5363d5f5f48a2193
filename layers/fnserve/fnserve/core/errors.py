"""One error hierarchy; each class carries the HTTP status it maps to, and :func:`grpc_code` the gRPC code of each."""

from __future__ import annotations

import re
from typing import Any, ClassVar


class FnserveError(Exception):
    """Base of every error fnserve raises on purpose; rendered as ``{"error": message}``."""

    status_code: ClassVar[int] = 500
    retry_after: ClassVar[int | None] = None  # seconds a client should wait before trying again, if known

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        """The plain form that crosses process boundaries (never the pickled exception)."""
        return {"type": type(self).__name__, "message": self.message, "status_code": self.status_code}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FnserveError:
        """Rebuild an error sent by :meth:`to_dict`, as the closest known class."""
        error_cls = _known().get(str(data.get("type")), FnserveError)
        return error_cls(str(data.get("message", "")), int(data.get("status_code", 500)))


class BadRequest(FnserveError):
    """The request could not be parsed (malformed JSON, wrong framing)."""

    status_code = 400


class Unauthorized(FnserveError):
    """The caller brought no API key, or one the server does not hold."""

    status_code = 401


class ModelNotFound(FnserveError):
    """No model, or no such version of a model, is in the manifest."""

    status_code = 404


def unknown_model(name: str, version: str | None = None, detail: str = "") -> ModelNotFound:
    """A :class:`ModelNotFound` in Triton's words, which clients written against Triton match on."""
    what = repr(name) if version is None else f"{name!r} version {version}"
    return ModelNotFound(f"Request for unknown model: {what} is not found{detail}")


class PayloadTooLarge(FnserveError):
    """The request body is over the configured size limit."""

    status_code = 413


class UnsupportedMediaType(FnserveError):
    """A request body in a content coding (or type) the server does not read."""

    status_code = 415


class InvalidInput(FnserveError):
    """The request parsed, but its tensors do not fit the model."""

    status_code = 422


class ModelNotReady(FnserveError):
    """The model exists but cannot serve now (still loading, or failed to load)."""

    status_code = 503


class Overloaded(FnserveError):
    """More arrives than the model can serve in time: its queue is full, or the request waited past its queue
    deadline. Refused at once (never run), to be tried again shortly: 503 with Retry-After, gRPC UNAVAILABLE."""

    status_code = 503
    retry_after = 1


class ModelLoadError(ModelNotReady):
    """A model file is missing, corrupt, fails its checksum or is not valid ONNX."""


class InferenceError(FnserveError):
    """The runtime failed on input that passed validation: a server-side fault."""

    status_code = 500


class ConfigError(FnserveError):
    """Settings or a manifest are invalid, or a deployment lacks what a request needs (a bucket, a table)."""

    status_code = 500


def refused_at(exc: Exception) -> tuple[list[str | int], str]:
    """Where msgspec's error is (``$.models[0].max_batch_size`` as ``["models", 0, "max_batch_size"]``; empty: the
    whole value, as a ``__post_init__`` check says) and what it says: the settings and the manifest each name the
    field in a :class:`ConfigError` of their own from it."""
    message, _, at = str(exc).partition(" - at `$")
    return [int(index) if index else field for field, index in re.findall(r"\.(\w+)|\[(\d+)\]", at)], message


class StoreUnavailable(FnserveError):
    """A store fnserve depends on (DynamoDB, S3, SQS) timed out, throttled or is unreachable: it may heal."""

    status_code = 503
    retry_after = 1


class ResultNotFound(FnserveError):
    """No stored result has this id: never minted here, or expired."""

    status_code = 404


class HandlerError(FnserveError):
    """A function's handler raised (Lambda reports this as a function error), or its init failed."""

    status_code = 502


class WorkerDied(FnserveError):
    """The worker process running an invocation exited before answering."""

    status_code = 503


class InvocationTimeout(FnserveError):
    """The invocation ran past its timeout; its worker was replaced."""

    status_code = 504


class DeadlineExceeded(InvocationTimeout):
    """The caller's deadline passed before its inference finished (dropped, not computed, if still queued)."""


class ClientGone(Exception):  # noqa: N818 - not an error anyone answers: there is nobody to answer
    """The client went away before its request arrived: nothing to answer, nothing to record."""


# The gRPC status of each HTTP status (names of grpc.StatusCode): what a client sent wrong is never
# UNKNOWN or INTERNAL. A server-side fault (500, 502) is INTERNAL.
GRPC_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def grpc_code(status: int) -> str:
    """The name of the gRPC status code an error of HTTP ``status`` is answered with."""
    return GRPC_CODES.get(status, "INTERNAL")


def _known() -> dict[str, type[FnserveError]]:
    """fnserve's own error classes by name."""
    found: dict[str, type[FnserveError]] = {}
    pending: list[type[FnserveError]] = [FnserveError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending += cls.__subclasses__()
    return found
