"""One inference as every transport serves it: decoded, inferred through the data plane, encoded; timed,
traced, logged and recorded; a refusal mapped to its REST status and gRPC code.

HTTP (the server, Lambda through Mangum, Cloud Functions, SageMaker's ``/invocations``) and gRPC
each only say how their request is decoded and their answer encoded; the rest is here, once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from fnserve import tracing
from fnserve.adapters import logs
from fnserve.adapters.logs import logger
from fnserve.core.dataplane import Answer, DataPlane
from fnserve.core.errors import FnserveError, InvocationTimeout


class Decoded(Protocol):
    """A request decoded from its transport's format: the tensors, and the outputs asked for (None: all)."""

    @property
    def inputs(self) -> Mapping[str, Any]: ...

    @property
    def outputs(self) -> Sequence[str] | None: ...


B = TypeVar("B")  # a request as it arrives: HTTP's body bytes, gRPC's parsed message
R = TypeVar("R", bound=Decoded)  # a request decoded: V2's InferenceRequest, gRPC's GrpcRequest
T = TypeVar("T")  # an answer as it leaves

EXTENSIONS = ["binary_tensor_data"]  # the V2 protocol extensions fnserve speaks, on every transport

# The gRPC status of each HTTP status (names of grpc.StatusCode): what a client sent wrong is never
# UNKNOWN or INTERNAL. A server-side fault (500, 502) is INTERNAL.
GRPC_CODES = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    413: "RESOURCE_EXHAUSTED",
    422: "INVALID_ARGUMENT",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def grpc_code(status: int) -> str:
    """The name of the gRPC status code an error of HTTP ``status`` is answered with."""
    return GRPC_CODES.get(status, "INTERNAL")


class Telemetry(Protocol):
    """Where per-request figures go (EMF metrics in Lambda, Prometheus in the server, nothing by default)."""

    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None: ...


class NoTelemetry:
    def record(self, model: str, status: int, timings: dict[str, float], cache: str, version: str = "") -> None:
        return None


class ClientGone(Exception):
    """The client went away before its request arrived: nobody to answer, nothing to record."""


class DeadlineExceeded(InvocationTimeout):
    """The caller's deadline passed before its inference finished (it was dropped, not computed, if still queued)."""


class Envelope:
    """What every inference gets, whichever transport carried it; ``transport`` names it in spans and logs."""

    def __init__(self, plane: DataPlane, transport: str, telemetry: Telemetry, *, access_log: bool) -> None:
        self.plane = plane
        self.transport = transport
        self.telemetry = telemetry
        self.access_log = access_log
        self._where = {} if transport == "http" else {"transport": transport}

    async def serve(
        self,
        name: str,
        version: str | None,
        body: Awaitable[B],
        decode: Callable[[B], R],
        encode: Callable[[Answer, R], T],
        traceparent: str | None = None,
        deadline: float | None = None,
    ) -> tuple[T, Answer, dict[str, float]]:
        """One inference: the encoded answer, the answer, and the milliseconds of each stage.

        ``deadline``: seconds the caller waits (gRPC's); past it, the inference is dropped and a
        :class:`DeadlineExceeded` raised. A refusal is logged, recorded and raised as an
        :class:`FnserveError` (anything unexpected as a 500 "internal server error", its traceback logged).
        Traced (when tracing is on) in the caller's trace when ``traceparent`` says which.
        """
        span = tracing.start_request(name, self.transport, traceparent)
        try:
            t0 = time.perf_counter()
            decoded = decode(await body)
            t1 = time.perf_counter()
            call = self.plane.infer(name, decoded.inputs, version=version, outputs=decoded.outputs)
            if deadline is None:
                answer = await call
            else:
                left = deadline - (t1 - t0)
                if left <= 0:
                    call.close()  # never started
                    raise TimeoutError()
                answer = await asyncio.wait_for(call, left)
            t2 = time.perf_counter()
            payload = encode(answer, decoded)
            t3 = time.perf_counter()
        except FnserveError as exc:
            self._refused(name, exc, span)
            raise
        except TimeoutError:
            error: FnserveError = DeadlineExceeded("the deadline passed before the inference finished")
            self._refused(name, error, span)
            raise error from None
        except ClientGone:
            if span is not None:
                span.end(499, error="client gone")
            raise
        except Exception as exc:
            logger.exception("unhandled error", extra={"model": name, "transport": self.transport})
            error = FnserveError("internal server error")
            self._refused(name, error, span)
            raise error from exc
        except BaseException:  # cancelled: the client went away, or its deadline passed
            if span is not None:
                span.end(499, error="cancelled")
            raise
        timings = {"decode": round((t1 - t0) * 1e3, 3), **answer.timings, "encode": round((t3 - t2) * 1e3, 3)}
        if self.access_log:
            fields = {"model": name, "version": answer.version, "status": 200, "cache": answer.cache, **timings}
            if answer.device:
                fields["device"] = answer.device
            logs.access("inference", fields | self._where)
        self.telemetry.record(name, 200, timings, answer.cache, answer.version)
        if span is not None:
            span.end(200, timings)
        return payload, answer, timings

    def _refused(self, name: str, error: FnserveError, span: tracing.RequestSpan | None) -> None:
        if self.access_log:
            fields = {"model": name, "status": error.status_code, "error": error.message}
            logs.access("inference refused", fields | self._where)
        self.telemetry.record(name, error.status_code, {}, "off")
        if span is not None:
            span.end(error.status_code, error=error.message)
