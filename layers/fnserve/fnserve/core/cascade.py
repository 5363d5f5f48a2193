"""Cascades: a fast model answers now; a slow, accurate one follows up unless the fast one is sure.

The confidence rule reads one output of the fast model (probabilities, or logits turned into
probabilities) and asks, per row, whether the top class is probable enough (``top1``) or far
enough ahead of the second (``margin``). A request skips the slow model only when every one
of its rows is confident.

Follow-up ids are minted here and signed (HMAC-SHA256), and say what they are: the results
API can tell ``skipped`` and ``pending`` from an unknown id without anything stored first, so
the request path costs the fast model plus at most one queue send.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fnserve.core.errors import InvalidInput
from fnserve.core.jobs import job_message
from fnserve.core.names import check_name

if TYPE_CHECKING:
    from fnserve.core.service import InferenceService, Prediction

logger = logging.getLogger(__name__)

Status = Literal["pending", "skipped"]


class CascadeSettings(BaseModel):
    """A cascade in the manifest: served as a model of its own name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")
    fast: str = Field(description="The fast model, which answers at once.")
    fast_version: str | None = Field(default=None, description="Its version (default: latest).")
    slow: str = Field(description="The slow, accurate model, run as a follow-up.")
    slow_version: str | None = Field(default=None, description="Its version (default: latest).")
    output: str = Field(description="The fast model's output the confidence rule reads ([rows, classes]).")
    scores: Literal["probabilities", "logits"] = Field(
        default="probabilities", description="What the output holds; logits go through a softmax."
    )
    rule: Literal["top1", "margin"] = Field(
        default="top1", description="top1: top-class probability >= threshold; margin: top1 - top2 >= threshold."
    )
    threshold: float = Field(
        ge=0.0, le=1.0, description="Confident at or above this; tune with `fnserve cascade tune`."
    )
    queue_url: str | None = Field(
        default=None, description="Follow-up queue; default: FNSERVE_FOLLOWUP_QUEUE_URL of the server settings."
    )
    result_ttl_seconds: int = Field(default=86_400, ge=60, description="How long follow-up results are kept.")

    @field_validator("name", "fast", "slow")
    @classmethod
    def _names(cls, value: str) -> str:
        return check_name(value, "name")

    @model_validator(mode="after")
    def _distinct(self) -> CascadeSettings:
        if self.fast == self.slow and self.fast_version == self.slow_version:
            raise ValueError(f"cascade {self.name!r}: fast and slow are the same model")
        return self


def confidence(scores: np.ndarray[Any, Any], cascade: CascadeSettings) -> np.ndarray[Any, Any]:
    """The rule's value per row (compare it with the threshold)."""
    if scores.ndim != 2 or scores.shape[1] < 2:
        raise InvalidInput(
            f"cascade {cascade.name!r}: output {cascade.output!r} must be [rows, classes], got {list(scores.shape)}"
        )
    p = scores.astype(np.float64, copy=False)
    if cascade.scores == "logits":
        p = np.exp(p - p.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    if cascade.rule == "top1":
        return np.asarray(p.max(axis=1))
    top2 = np.partition(p, -2, axis=1)[:, -2:]
    return np.asarray(top2[:, 1] - top2[:, 0])


def confident(scores: np.ndarray[Any, Any], cascade: CascadeSettings) -> bool:
    """Whether every row of a request clears the threshold (then the slow model is skipped)."""
    return bool(np.all(confidence(scores, cascade) >= cascade.threshold))


@dataclass(frozen=True, slots=True)
class FollowupId:
    """What a follow-up id says about itself."""

    status: Status
    created: int
    cascade: str
    value: str


class FollowupIds:
    """Mints and checks signed follow-up ids: ``{p|s}-{created, base 36}-{nonce}-{cascade}-{signature}``."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def mint(self, status: Status, cascade: str, now: float | None = None) -> str:
        created = int(time.time() if now is None else now)
        body = f"{status[0]}-{np.base_repr(created, 36).lower()}-{os.urandom(8).hex()}-{cascade}"
        return f"{body}-{self._sign(body)}"

    def parse(self, value: str) -> FollowupId | None:
        """The id's claims, or None for anything this deployment did not mint."""
        body, _, signature = value.rpartition("-")
        if not body or not hmac.compare_digest(signature, self._sign(body)):
            return None
        kind, created, _, cascade = body.split("-", 3)
        status: Status = "pending" if kind == "p" else "skipped"
        return FollowupId(status, int(created, 36), cascade, value)

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()[:20]


class FollowupSender(Protocol):
    """Where follow-up jobs go (SQS in AWS)."""

    def send(self, queue_url: str, job: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class CascadeAnswer:
    """The fast answer and what became of its follow-up."""

    prediction: Prediction
    status: Literal["pending", "skipped", "unavailable"]
    followup_id: str | None


class CascadeRunner:
    """Runs cascades: the fast model now, then one follow-up job unless every row is confident."""

    def __init__(
        self,
        service: InferenceService,
        ids: FollowupIds,
        sender: FollowupSender | None = None,
        default_queue: str | None = None,
    ) -> None:
        self.service = service
        self.ids = ids
        self.sender = sender
        self.default_queue = default_queue
        self.cascades = {c.name: c for c in service.registry.manifest.cascades}

    def infer(self, name: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> CascadeAnswer:
        cascade = self.cascades[name]
        requested = self.service.output_names(cascade.fast, outputs, version=cascade.fast_version)
        fast = self.service.infer(cascade.fast, inputs, version=cascade.fast_version)
        if cascade.output not in fast.outputs:
            raise InvalidInput(f"cascade {name!r}: model {cascade.fast!r} has no output {cascade.output!r}")
        answer = fast if outputs is None else dataclasses.replace(fast, outputs={o: fast.outputs[o] for o in requested})
        if confident(fast.outputs[cascade.output], cascade):
            return CascadeAnswer(answer, "skipped", self.ids.mint("skipped", name))
        queue = cascade.queue_url or self.default_queue
        if self.sender is None or queue is None:
            logger.warning("cascade %r: no follow-up queue is configured; the fast answer is final", name)
            return CascadeAnswer(answer, "unavailable", None)
        followup_id = self.ids.mint("pending", name)
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        job = job_message(followup_id, cascade.slow, arrays, version=cascade.slow_version, outputs=list(outputs or []))
        try:
            self.sender.send(queue, job)
        except Exception:  # the fast answer must not be lost to a queue outage
            logger.exception("cascade %r: could not enqueue the follow-up", name)
            return CascadeAnswer(answer, "unavailable", None)
        return CascadeAnswer(answer, "pending", followup_id)
