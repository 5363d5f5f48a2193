"""Requests that arrive together run together: a model's requests decoded in one turn of the event loop, as one call.

In a long-running server an in-process model runs on the event loop, one request after another. Requests come in
groups: the answers of one turn leave together (:mod:`fnserve.adapters.http.protocol`), so a closed loop of clients
sends its next requests together, and one turn decodes several for the same model. Run one by one, each pays the
runtime's fixed cost (the digits model: 14 µs for one row, 22 µs for eight) and, on the loop's core, evicts the
envelope's code and data from the caches between them. Here each waits for the end of the turn (no timer: only what
the loop already had), then the turn's requests to one model run as one vectorised call of the service
(:meth:`~fnserve.core.service.InferenceService.infer_many`: each validated alone, the cache asked once, stacked by
shape, a stack that fails run again one by one), and each gets its own rows back. A lone request is answered as
before, one turn of the loop later; one whose caller left before its turn ran is not computed.

Unlike the adaptive batcher (:mod:`fnserve.core.batching`), nothing here waits for requests to come: no window, no
queue, no thread; it is how a server runs the models that do not ask for adaptive batching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from fnserve.core.errors import FnserveError
from fnserve.core.providers import RAN_ON, RanOn
from fnserve.core.service import InferenceService, Prediction

_Call = tuple[str, str | None, tuple[str, ...] | None]  # model, version, outputs asked for: what may share a run
_Job = tuple[Mapping[str, Any], "asyncio.Future[Prediction]", RanOn | None]


class TurnBatcher:
    """Runs the requests of one turn of the event loop that call the same model (and version, and outputs) at once."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.runs = 0  # runs of the service (one a call of a turn), for tests
        self._waiting: dict[_Call, list[_Job]] | None = None  # this turn's, once a request came

    async def infer(
        self, name: str, inputs: Mapping[str, Any], *, version: str | None, outputs: Sequence[str] | None
    ) -> Prediction:
        """``name``'s answer to ``inputs``, computed at the end of this turn with the turn's other requests to it."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting
        if waiting is None:
            waiting = self._waiting = {}
            loop.call_soon(self._run)  # after every task the loop had ready: this turn's requests
        future: asyncio.Future[Prediction] = loop.create_future()
        call = (name, version, None if outputs is None else tuple(outputs))
        waiting.setdefault(call, []).append((inputs, future, RAN_ON.get()))
        return await future

    def _run(self) -> None:
        waiting, self._waiting = self._waiting or {}, None
        for call, jobs in waiting.items():
            live = [job for job in jobs if not job[1].done()]  # a request whose caller left is not computed
            if live:
                self._answer(call, live)

    def _answer(self, call: _Call, jobs: list[_Job]) -> None:
        name, version, outputs = call
        self.runs += 1
        ran_on = RanOn()
        token = RAN_ON.set(ran_on)  # the device that ran them, told to each request's own
        try:
            if len(jobs) == 1:
                results: list[Prediction | FnserveError] = [
                    self.service.infer(name, jobs[0][0], version=version, outputs=outputs)
                ]
            else:
                results = self.service.infer_many(name, [job[0] for job in jobs], version=version, outputs=outputs)
        except Exception as exc:  # what concerns them all (an unknown name or version, a model not ready)
            for _, future, _ in jobs:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            RAN_ON.reset(token)
        for (_, future, asked), result in zip(jobs, results, strict=True):
            if asked is not None:
                asked.device = ran_on.device
            if future.done():
                continue
            if isinstance(result, FnserveError):
                future.set_exception(result)
            else:
                future.set_result(result)
