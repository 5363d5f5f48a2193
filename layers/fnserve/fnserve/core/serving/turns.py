"""Requests that arrive together run together: a model's requests decoded in one turn of the event loop, as one call.

In a long-running server an in-process model runs on the event loop, one request after another. Requests come in
groups: the answers of one turn leave together (:mod:`fnserve.adapters.http.protocol`), so a closed loop of clients
sends its next requests together, and one turn decodes several for the same model. Run one by one, each pays the
runtime's fixed cost and, on the loop's core, evicts the envelope's code and data from the caches between them.
Here each waits for the end of the turn (no timer: only what the loop already had), then the turn's requests to one
model run as one vectorised call of the service
(:meth:`~fnserve.core.execution.service.InferenceService.infer_many`: each validated alone, the cache asked once,
stacked by shape, a stack that fails run again in halves by the runner), and each gets its own rows back. A lone
request is answered as before, one pass of the loop later; one whose caller left before its turn ran is not computed.

Unlike the adaptive batcher (:mod:`fnserve.core.batching.scheduler`), nothing here waits for requests to come: no
window, no queue, no thread; it is how a server runs the models on its CPU that do not ask for adaptive batching
(on a GPU each new batch size is a new plan, so a GPU model's requests run as they come: ``Servable.joins_turns``).
The figures behind it: docs/design/batching.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from fnserve.core.execution.service import InferenceService, Prediction

_Call = tuple[str, str | None, tuple[str, ...] | None]  # model, version, outputs asked for: what may share a run
_Job = tuple[Mapping[str, Any], "asyncio.Future[Prediction] | None"]  # None: the turn's first request


class TurnBatcher:
    """Runs the requests of one turn of the event loop that call the same model (and version, and outputs) at once.

    The turn's first request leads it: it lets the loop run the other tasks it had ready (``asyncio.sleep(0)``: the
    rest of this turn's requests, which join it and wait), and when some did, one pass more, for the requests the
    loop read meanwhile (a closed loop's clients send theirs a little apart), then runs them all. Alone, it goes on
    at once: a lone request costs one pass of the loop, where a future and a callback would cost two. With others,
    it goes on when they do, one pass later: answered a pass apart, the answers would leave in two writes, and the
    next requests would come back split."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.runs = 0  # runs of the service (one a call of a turn), for tests
        self._waiting: dict[_Call, list[_Job]] | None = None  # the turn's, while its first request lets others join

    async def infer(
        self, name: str, inputs: Mapping[str, Any], *, version: str | None, outputs: Sequence[str] | None
    ) -> Prediction:
        """``name``'s answer to ``inputs``, computed at the end of this turn with the turn's other requests to it."""
        call = (name, version, None if outputs is None else tuple(outputs))
        waiting = self._waiting
        if waiting is not None:  # a turn is gathering: join it
            future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
            waiting.setdefault(call, []).append((inputs, future))
            return await future
        waiting = self._waiting = {call: [(inputs, None)]}
        try:
            await asyncio.sleep(0)  # the loop runs the tasks it had ready: this turn's other requests join
            if len(waiting) > 1 or len(waiting[call]) > 1:  # and one pass more for those read meanwhile
                await asyncio.sleep(0)
        except BaseException:  # cancelled (the caller left): the others are answered all the same, not this one
            self._waiting = None
            waiting[call].pop(0)
            asyncio.get_running_loop().call_soon(self._run, waiting)
            raise
        self._waiting = None
        outcome = self._run(waiting)
        if len(waiting) > 1 or len(waiting[call]) > 1:
            # Others joined: answer with them, one pass later (their tasks wake then). The answers of a turn leave
            # in one write each at its end, so the clients' next requests come back together, as one turn again.
            await asyncio.sleep(0)
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome

    def _run(self, waiting: dict[_Call, list[_Job]]) -> Prediction | BaseException | None:
        """Every call of the turn run and answered; the leading request's own outcome (None: it left)."""
        own = None
        for call, jobs in waiting.items():
            live = [job for job in jobs if job[1] is None or not job[1].done()]  # one whose caller left: not computed
            if live:
                outcome = self._answer(call, live)
                own = outcome if outcome is not None else own
        return own

    def _answer(self, call: _Call, jobs: list[_Job]) -> Prediction | BaseException | None:
        """One call's jobs run at once, each future answered; the outcome of the job without one (the leader's)."""
        name, version, outputs = call
        self.runs += 1
        results: Sequence[Prediction | Exception]
        try:
            if len(jobs) == 1:
                results = [self.service.infer(name, jobs[0][0], version=version, outputs=outputs)]
            else:
                results = self.service.infer_many(name, [job[0] for job in jobs], version=version, outputs=outputs)
        except Exception as exc:  # what concerns them all (an unknown name or version, a model not ready)
            results = [exc] * len(jobs)
        own: Prediction | BaseException | None = None
        for (_, future), result in zip(jobs, results, strict=True):
            if future is None:
                own = result
            elif future.done():
                continue
            elif isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        return own
