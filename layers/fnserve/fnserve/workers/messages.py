"""What crosses the pipe between the pool and a worker: plain, typed messages.

Only these classes and plain data cross (events and responses as dicts, lists, strings,
numbers, bytes, numpy arrays); errors travel as ``{type, message, status_code}``
(:meth:`~fnserve.core.errors.FnserveError.to_dict`), never as pickled exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fnserve.core.models.datatypes import Arrays

# -- pool -> worker ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Invoke:
    """Run the handler on ``event``; ``timeout`` seconds is what the Lambda context tells it."""

    id: str
    event: Any
    timeout: float


# None on the pipe tells a worker to exit.

# -- worker -> pool ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The handler's module is imported: its warm globals are built."""


@dataclass(frozen=True, slots=True)
class InitFailed:
    """The handler's module would not import; the worker exits next."""

    message: str


@dataclass(frozen=True, slots=True)
class Started:
    """The worker took invocation ``id``: from now on it may have run."""

    id: str


@dataclass(frozen=True, slots=True)
class Usage:
    """What one invocation cost, as Lambda's REPORT line tells it (only for a spec with ``console``)."""

    duration_ms: float
    max_memory_mb: int
    init_ms: float | None = None  # the worker's import of the handler, on its first invocation (a cold start)


@dataclass(frozen=True, slots=True)
class Output:
    """A line the function wrote to stdout or stderr (only for a spec with ``console``)."""

    text: str


@dataclass(frozen=True, slots=True)
class Returned:
    """The handler's response to invocation ``id``."""

    id: str
    response: Any
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Raised:
    """The handler raised on invocation ``id``: the error as plain data."""

    id: str
    error: dict[str, Any]
    usage: Usage | None = None


FromWorker = Ready | InitFailed | Started | Output | Returned | Raised

# -- the inference worker's events (the server's front process -> its workers) ------------------


@dataclass(frozen=True, slots=True)
class RunModel:
    """Run one model version on validated inputs; the response is its outputs (``Arrays``)."""

    model: str
    version: str
    outputs: list[str]
    inputs: Arrays = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Describe:
    """Describe every loaded model; the response is a :class:`Described`."""


@dataclass(frozen=True, slots=True)
class Described:
    """Each loaded model version: name, version, providers, inputs and outputs (V2 metadata form)."""

    models: list[dict[str, Any]]
