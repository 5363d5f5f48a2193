"""Cascades: a fast model answers now; a slow, accurate one follows up unless the fast one is sure.

The confidence rule reads one output of the fast model (probabilities, or logits turned into
probabilities) and asks, per row, whether the top class is probable enough (``top1``) or far
enough ahead of the second (``margin``). A request skips the slow model only when every one
of its rows is confident. The follow-up is an ordinary job for the slow model, under a signed
id (:mod:`fnserve.core.jobs.followups`) that its result is looked up by.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from fnserve.core.errors import InvalidInput
from fnserve.core.execution.service import InferenceService, Prediction
from fnserve.core.jobs.followups import FollowupIds
from fnserve.core.jobs.messages import job_message
from fnserve.core.models.manifest.cascades import CascadeSettings

logger = logging.getLogger(__name__)


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


def output(outputs: Mapping[str, np.ndarray[Any, Any]], cascade: CascadeSettings) -> np.ndarray[Any, Any]:
    """The fast model's output that the rule reads."""
    scores = outputs.get(cascade.output)
    if scores is None:
        raise InvalidInput(f"cascade {cascade.name!r}: model {cascade.fast!r} has no output {cascade.output!r}")
    return scores


def confident(scores: np.ndarray[Any, Any], cascade: CascadeSettings) -> bool:
    """Whether every row of a request clears the threshold (then the slow model is skipped)."""
    return bool(np.all(confidence(scores, cascade) >= cascade.threshold))


def settle(
    service: InferenceService, cascade: CascadeSettings, inputs: Mapping[str, Any]
) -> tuple[dict[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    """What the cascade answers for each row as its own request, once follow-ups are done: the fast
    model's outputs where the row is confident, the slow model's elsewhere; and which rows the slow
    model answered. For offline runs (``fnserve predict``); both models must share their output names."""
    fast = service.infer(cascade.fast, inputs, version=cascade.fast_version).outputs
    unsure = confidence(output(fast, cascade), cascade) < cascade.threshold
    if not unsure.any():
        return dict(fast), unsure
    rows = np.flatnonzero(unsure)
    unsure_inputs = {k: np.asarray(v)[rows] for k, v in inputs.items()}
    slow = service.infer(cascade.slow, unsure_inputs, version=cascade.slow_version)
    settled = {}
    for name, values in fast.items():
        if name not in slow.outputs:
            raise InvalidInput(f"cascade {cascade.name!r}: model {cascade.slow!r} has no output {name!r}")
        merged = np.array(values, copy=True)
        merged[rows] = slow.outputs[name]
        settled[name] = merged
    return settled, unsure


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
        requested = self.service.servable(cascade.fast, cascade.fast_version).requested(outputs)
        fast = self.service.infer(cascade.fast, inputs, version=cascade.fast_version)
        scores = output(fast.outputs, cascade)
        answer = fast if outputs is None else dataclasses.replace(fast, outputs={o: fast.outputs[o] for o in requested})
        if confident(scores, cascade):
            return CascadeAnswer(answer, "skipped", self.ids.mint("skipped", name))
        queue = cascade.queue_url or self.default_queue
        if self.sender is None or queue is None:
            logger.warning("cascade %r: no follow-up queue is configured; the fast answer is final", name)
            return CascadeAnswer(answer, "unavailable", None)
        followup_id = self.ids.mint("pending", name)
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        # Raw bytes (a pipeline's images) have no JSON form: such inputs travel in binary.
        binary = any(a.dtype == object for a in arrays.values())
        job = job_message(
            followup_id, cascade.slow, arrays, version=cascade.slow_version, outputs=list(outputs or []), binary=binary
        )
        try:
            self.sender.send(queue, job)
        except Exception:  # the fast answer must not be lost to a queue outage
            logger.exception("cascade %r: could not enqueue the follow-up", name)
            return CascadeAnswer(answer, "unavailable", None)
        return CascadeAnswer(answer, "pending", followup_id)
