"""A request's deadline and what its texts are foreseen to cost: a request that cannot be answered in time is
refused before its model runs, or as soon as its own runs show it, never cut off by the platform.

The deadline is a context variable (:data:`DEADLINE`): whatever knows how long the caller waits sets it for the
request's task (the data plane from a caller's timeout or the server's request timeout, the Lambda and Cloud
Function handlers from the invocation's remaining time and API Gateway's 29 s, the job processor from the
invocation's remaining time), and the runs of a request's texts (:meth:`Foresight.check`) read it: threads
started with ``asyncio.to_thread`` see their caller's. A model's pace (:class:`TokenPace`) is the seconds a
padded token took in its latest runs in this process.
"""

from __future__ import annotations

import math
import time
from contextvars import ContextVar
from dataclasses import dataclass

from fnserve.core.errors import PayloadTooLarge

PACE_DECAY = 0.9  # each run's share of a model's pace: its tokens and seconds, the older runs' decayed by this


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a request's caller stops waiting (``time.monotonic``), and what sets that (for the refusal)."""

    at: float
    why: str

    def left(self) -> float:
        return self.at - time.monotonic()


DEADLINE: ContextVar[Deadline | None] = ContextVar("fnserve_deadline", default=None)
# Whether what runs is a caller's request, bound by the tokens a request may hold and by its deadline; a batch of
# jobs is not: it is sliced by its own time (the job processor), and a job must never be refused as a request is.
A_REQUEST: ContextVar[bool] = ContextVar("fnserve_a_request", default=True)


def within(seconds: float, why: str) -> Deadline:
    """The deadline ``seconds`` from now, or the one already set if that comes sooner."""
    mine = Deadline(time.monotonic() + seconds, why)
    current = DEADLINE.get()
    return current if current is not None and current.at <= mine.at else mine


class RequestTooLong(PayloadTooLarge):
    """A request whose texts cannot be run within its deadline (foreseen at its model's pace, or seen in its own
    runs), or that holds more tokens than a request may: refused (413, gRPC RESOURCE_EXHAUSTED, OpenAI's
    ``invalid_request_error``), with the way to send it instead."""

    code = "request_too_long"


class TooManyTokens(RequestTooLong):
    code = "max_tokens_per_request"


class TokenPace:
    """Seconds a padded token takes a model, from its latest runs in this process (their sums, decayed: the
    long runs that bound a request's time weigh by their tokens, not one a run)."""

    __slots__ = ("_tokens", "_seconds")

    def __init__(self) -> None:
        self._tokens = 0.0
        self._seconds = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self._tokens = self._tokens * PACE_DECAY + tokens
        self._seconds = self._seconds * PACE_DECAY + seconds

    def per_token(self) -> float | None:
        """Seconds a padded token, or None before any run."""
        return self._seconds / self._tokens if self._tokens else None


class Foresight:
    """One request's texts against its deadline: ``tokens`` padded tokens in all, run ``parallel`` runs at a time.
    :meth:`check` before each run refuses the request when what is left would end past the deadline: at the
    model's pace until an eighth of its tokens ran, then at the request's own (the load included), timed from the
    end of its first run, which pays what a run of a new length costs once."""

    __slots__ = ("deadline", "tokens", "pace", "parallel", "done", "_since", "_timed")

    def __init__(self, tokens: int, pace: TokenPace, parallel: int = 1) -> None:
        self.deadline = DEADLINE.get() if A_REQUEST.get() else None
        self.tokens = tokens
        self.pace = pace
        self.parallel = max(1, parallel)
        self.done = 0  # padded tokens run so far
        self._since = 0.0  # when its first run ended
        self._timed = 0  # padded tokens run since then

    def ran(self, tokens: int) -> None:
        if self.done:
            self._timed += tokens
        else:
            self._since = time.monotonic()
        self.done += tokens

    def _per_token(self, now: float) -> float | None:
        """Seconds a token not run yet is foreseen to take: the model's pace, then the request's own."""
        per_token = self.pace.per_token()
        if per_token is not None:
            per_token /= self.parallel
        if self._timed and (per_token is None or self.done * 8 >= self.tokens):
            per_token = (now - self._since) / self._timed
        return per_token

    def latest_start(self) -> float:
        """The latest its next run may start (``time.monotonic``) for what is left to end by the deadline: until
        then a request of its own may go before it (infinite without a deadline or a pace)."""
        now = time.monotonic()
        per_token = self._per_token(now)
        if self.deadline is None or per_token is None:
            return math.inf
        return self.deadline.at - (self.tokens - self.done) * per_token

    def check(self) -> None:
        """Raise :class:`RequestTooLong` where the tokens not run yet cannot be run before the deadline."""
        deadline = self.deadline
        if deadline is None or self.done >= self.tokens:
            return
        now = time.monotonic()
        per_token = self._per_token(now)
        if per_token is None:
            return  # nothing to foresee by yet: its own runs tell
        left = deadline.at - now
        foreseen = (self.tokens - self.done) * per_token
        if foreseen <= left:
            return
        fits = int(max(left, 0.0) / per_token) if per_token > 0 else self.tokens
        ran = f" after {self.done} of them ran" if self.done else ""
        raise RequestTooLong(
            f"this request's {self.tokens} padded tokens would take about {foreseen:.1f} s more{ran}, past its "
            f"deadline ({deadline.why}: {max(left, 0.0):.1f} s left); send about {max(fits, 1)} tokens a request "
            "or fewer, or submit the texts as batch jobs (fnserve submit)"
        )
