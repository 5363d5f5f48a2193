"""The data plane: the one entry every transport calls (HTTP, and through it Lambda, Cloud Functions and
SageMaker; gRPC).

A transport hands :meth:`DataPlane.serve` a :class:`Request` (whom it is for, its body decoded on demand, its
answer encoded by the transport's codec) and gets the encoded answer back. Between the two, the plane decides
everything: refusals before the body is read, the route (a plain model, a batched model, a pipeline batched with
its model, or a cascade), the caller's deadline, the timings, and the record (the span, the access line, the
metrics: a transport's :class:`Recorder`). Every route gives one :class:`Answer`; an error is an
:class:`FnserveError` whose class says its REST status and gRPC code."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fnserve.core.codec.rows import batch_size
from fnserve.core.errors import ClientGone, DeadlineExceeded, FnserveError, ResultNotFound, unknown_model
from fnserve.core.execution.deadline import DEADLINE, Foresight, within
from fnserve.core.execution.pipeline import Staged
from fnserve.core.execution.servable import PipelineServable, TokenRuns
from fnserve.core.execution.service import InferenceService, Prediction, Prepared
from fnserve.core.models.datatypes import Arrays
from fnserve.core.serving.catalog import Catalog
from fnserve.core.serving.turns import TurnBatcher

if TYPE_CHECKING:
    from fnserve.core.batching.scheduler import AdaptiveBatcher, BatchObservers
    from fnserve.core.jobs.cascade import CascadeRunner
    from fnserve.core.jobs.followups import ResultLookup, ResultState

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
logger = logging.getLogger(__name__)


class Decoded(Protocol):
    """A request decoded from its transport's format: the tensors, and the outputs asked for (None: all)."""

    @property
    def inputs(self) -> Mapping[str, Any]: ...

    @property
    def outputs(self) -> Sequence[str] | None: ...

    @property
    def timeout(self) -> float | None: ...


@dataclass(slots=True)  # not frozen: one per request (a frozen init costs more), and timings are added as it goes
class Answer:
    """An inference answer, whatever served it.

    ``name`` is the served name (a model's, a pipeline's or a cascade's); ``model`` and ``version``
    say which model computed the outputs. ``parameters`` go back to the client (``cache``, and a
    cascade's ``answered_by`` and ``followup_*``); ``timings`` are milliseconds per stage (a
    pipeline's ``pre`` and ``post`` steps, ``queue`` while waiting for a batch, ``infer`` for the rest);
    ``device`` says which device computed them, where that is worth saying (a GPU, a mixed-device pool);
    ``encoded``: the answer as its transport writes it, and the milliseconds that took, where the thread that ran
    its batch wrote it (None: the envelope encodes it).
    """

    name: str
    model: str
    version: str
    outputs: Arrays
    cache: str
    parameters: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    device: str | None = None
    encoded: tuple[Any, float] | None = None


class Recording(Protocol):
    """One request's record, told how it ended: its transport ends its span, writes its access line, counts it."""

    def served(self, answer: Answer, timings: dict[str, float]) -> None: ...

    def refused(self, error: FnserveError) -> None: ...

    def cancelled(self, reason: str) -> None: ...


class Recorder(Protocol):
    """What records a transport's requests, a :class:`Recording` each (``envelope.RequestRecorder``)."""

    def start(self, name: str, version: str | None, traceparent: str | None) -> Recording: ...


class Request(Protocol[T_co]):
    """A request as its transport hands it to the data plane: whom it is for and its caller's terms, known before
    its body; the body read and decoded only once the request is admitted; the answer written as its transport
    writes it (in the thread that ran its batch, for a batched model)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str | None: ...

    @property
    def traceparent(self) -> str | None: ...

    @property
    def deadline(self) -> float | None:
        """The seconds its caller waits, where the transport knows them before the body (gRPC's)."""

    async def decoded(self) -> Decoded: ...

    def encode(self, answer: Answer) -> T_co: ...


class DataPlane:
    """Inference and results over one :class:`InferenceService`; what it serves is its :attr:`catalog`.

    ``batching``: models whose manifest entry sets ``max_batch_time_ms`` get an adaptive
    batcher (long-lived processes only; a Lambda container serves one request at a time),
    with up to ``max_concurrent_batches`` batches of a model running at once (one per worker
    process); the other models that run in this process on its CPU, and whose requests stack (every
    tensor batch-first, ``stack_requests``), run the requests that one turn of the event loop decodes as
    one call (:class:`~fnserve.core.serving.turns.TurnBatcher`: nothing waits for more). ``offload``:
    blocking calls (inference in worker processes, the cache's remote tier, follow-up sends)
    wait in a thread, not on the event loop, which keeps answering (health checks included)
    while DynamoDB stalls; otherwise they run inline, fastest for in-process models with
    nothing remote, and in Lambda, where a container answers one request at a time. A
    model's own requests are offloaded only when they may block (models in workers, a remote
    cache tier): a cascade's follow-up send does not send the models beside it to a thread (a thread
    hop costs more than a small model's run; docs/design/dataplane.md). ``observers``: each batched model's
    (:class:`~fnserve.core.batching.scheduler.BatchObservers`, a server's metrics), given to its batcher when it is
    built. ``request_timeout``: the seconds a caller waits here (Cloud Run's request timeout), against which a
    request of many texts is refused at once when its runs cannot end in time (a caller's own shorter one wins).
    """

    def __init__(
        self,
        service: InferenceService,
        *,
        cascades: CascadeRunner | None = None,
        results: ResultLookup | None = None,
        batching: bool = False,
        max_concurrent_batches: int = 1,
        offload: bool = False,
        observers: Callable[[str], BatchObservers] | None = None,
        request_timeout: float | None = None,
    ) -> None:
        self.service = service
        self.request_timeout = request_timeout  # the longest a caller waits here (a platform's), where known
        self.cascades = cascades
        self.results = results
        self.offload = offload
        # Batched requests look the cache up before they join a batch: off the loop if that leaves the process.
        self._offload_cache = offload and service.cache is not None and service.cache.remote
        self._offload_models = self._offload_cache or (offload and not service.registry.in_process)
        self.batchers = {}
        if batching:  # a Lambda function never batches: its cold start does not import the batcher
            from fnserve.core.batching.scheduler import batchers_for

            self.batchers = batchers_for(service, max_concurrent_batches, observers)
        # The other models' requests that one turn of the loop decodes run as one call, where the model runs here.
        self.turns = TurnBatcher(service) if batching and not self._offload_models else None
        # A pipeline joins the batcher of its model, when it runs the model's default version.
        self.batched_model = {
            p.name: p.model
            for p in service.registry.manifest.pipelines
            if p.version in (None, service.registry.resolve(p.model).version)
        }
        self.catalog = Catalog(service, cascades)
        self.statistics = self.catalog.statistics  # recorded here, reported by the catalog
        self.names = self.catalog.names
        self._counted = self.catalog.counted

    # -- inference ------------------------------------------------------------------------------

    def serve(self, recorder: Recorder, request: Request[T]) -> Awaitable[tuple[T, Answer, dict[str, float]]]:
        """One request, whatever carried it: awaited, the encoded answer, the answer, and the milliseconds of each
        stage.

        What is decided before the body is raised here, before anything is awaited, its body never read: an
        unknown name (404), and an overloaded batched model's refusal (503), since under overload most requests
        are refusals and each must cost next to nothing. ``request.deadline`` bounds the rest (with the request's
        own ``timeout`` parameter, Triton's, when it is shorter): a batched model refuses the request at once when
        it foresees its answer later, and past it the inference is dropped (not computed, if it is still queued)
        and a :class:`DeadlineExceeded` raised. A refusal is an :class:`FnserveError`, anything unexpected a 500
        "internal server error" (its traceback logged). The recorder's span continues ``request.traceparent``.
        """
        name, version = request.name, request.version
        arrived = time.perf_counter_ns()
        try:
            # A request naming none (gRPC bytes that are not a request) is judged by its body.
            if name and name not in self.names:
                raise unknown_model(name)
            batcher = self._batcher(name, version)
            arriving = batcher.admitted(within=request.deadline) if batcher is not None else None
        except FnserveError as refusal:
            recorder.start(name, version, request.traceparent).refused(refusal)
            self.statistics.failed(name, self._version_of(name, version), time.perf_counter_ns() - arrived)
            raise
        return self._serve(recorder.start(name, version, request.traceparent), request, arriving, arrived)

    async def _serve(
        self, recording: Recording, request: Request[T], arriving: AbstractContextManager[None] | None, arrived: int
    ) -> tuple[T, Answer, dict[str, float]]:
        name, version, deadline = request.name, request.version, request.deadline
        try:
            t0 = time.perf_counter()
            if arriving is None:
                decoded = await request.decoded()
            else:
                with arriving:  # counted as coming to the model's queue while its body is read
                    decoded = await request.decoded()
            t1 = time.perf_counter()
            if decoded.timeout is not None:
                deadline = decoded.timeout if deadline is None else min(deadline, decoded.timeout)
            # What the runs of its texts foresee against: the caller's wait, the server's, the platform's, the soonest.
            if deadline is not None:
                DEADLINE.set(within(deadline - (t1 - t0), "the request's timeout"))
            if self.request_timeout is not None:
                DEADLINE.set(within(self.request_timeout - (t1 - t0), "the server's request timeout"))
            if deadline is None:
                answer = await self.infer(
                    name, decoded.inputs, version=version, outputs=decoded.outputs, encode=request.encode
                )
            else:
                try:
                    left = deadline - (t1 - t0)
                    if left <= 0:
                        raise TimeoutError()
                    async with asyncio.timeout(left):  # in this task: a deadline costs no task of its own
                        answer = await self.infer(
                            name,
                            decoded.inputs,
                            version=version,
                            outputs=decoded.outputs,
                            encode=request.encode,
                            within=left,
                        )
                except TimeoutError:
                    raise DeadlineExceeded("the deadline passed before the inference finished") from None
            if answer.encoded is None:
                t2 = time.perf_counter()
                payload = request.encode(answer)
                encoded_ms = round((time.perf_counter() - t2) * 1e3, 3)
            else:
                payload, encoded_ms = answer.encoded
        except FnserveError as exc:
            recording.refused(exc)
            self.statistics.failed(name, self._version_of(name, version), time.perf_counter_ns() - arrived)
            raise
        except ClientGone:
            recording.cancelled("client gone")
            raise
        except Exception as exc:
            logger.exception("unhandled error", extra={"model": name})
            error = FnserveError("internal server error")
            recording.refused(error)
            self.statistics.failed(name, self._version_of(name, version), time.perf_counter_ns() - arrived)
            raise error from exc
        except BaseException:  # cancelled: the client went away, or the server is stopping
            recording.cancelled("cancelled")
            raise
        timings = {"decode": round((t1 - t0) * 1e3, 3), **answer.timings, "encode": encoded_ms}
        recording.served(answer, timings)
        self.statistics.served(
            name,
            self._version_of(name, version),
            time.perf_counter_ns() - arrived,
            timings,
            answer.cache,
            batch_size(decoded.inputs),
        )
        return payload, answer, timings

    async def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        outputs: Sequence[str] | None = None,
        encode: Callable[[Answer], Any] | None = None,
        within: float | None = None,
    ) -> Answer:
        """The answer of whatever ``name`` serves, with its ``infer`` time. ``encode``: how its transport writes
        it, for a batched model to do in its batch's thread (then in the answer's ``encoded``). ``within``: the
        seconds its caller waits, for a batched model to refuse it at once if it foresees the answer later."""
        started = time.perf_counter()
        answer = await self._route(name, version, inputs, outputs, encode, within)
        timings = answer.timings
        spent = timings.get("queue", 0.0) + timings.get("pre", 0.0) + timings.get("post", 0.0) if timings else 0.0
        if answer.encoded is not None:
            spent += answer.encoded[1]
        timings["infer"] = round((time.perf_counter() - started) * 1e3 - spent, 3)
        return answer

    def _route(
        self,
        name: str,
        version: str | None,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        encode: Callable[[Answer], Any] | None = None,
        within: float | None = None,
    ) -> Awaitable[Answer]:
        """What serves ``name`` (and ``version``): a cascade, a batched model or pipeline, or one run alone."""
        if self.cascades is not None and name in self.cascades.cascades:
            if version is not None:
                raise unknown_model(name, version, ": a cascade has no versions")
            return self._cascade(name, inputs, outputs)
        batcher = self._batcher(name, version)
        if batcher is not None:
            return self._batched(batcher, name, inputs, outputs, encode, within)
        return self._model(name, version, inputs, outputs)

    def _batcher(self, name: str, version: str | None) -> AdaptiveBatcher | None:
        """The batcher that serves ``name`` (a model's, or its pipeline's model's), when one does."""
        return self.batchers.get(self.batched_model.get(name, name)) if version is None else None

    async def _model(
        self, name: str, version: str | None, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> Answer:
        if self._offload_models:
            prediction = await asyncio.to_thread(self.service.infer, name, inputs, version=version, outputs=outputs)
        elif self.turns is not None and self.service.servable(name, version).joins_turns:
            prediction = await self.turns.infer(name, inputs, version=version, outputs=outputs)
        else:
            prediction = self.service.infer(name, inputs, version=version, outputs=outputs)
        return _answer(name, prediction)

    async def _batched(
        self,
        batcher: AdaptiveBatcher,
        name: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        encode: Callable[[Answer], Any] | None,
        within: float | None,
    ) -> Answer:
        # Validated alone first: a bad request must not fail the batch it would have joined.
        if self._offload_cache:
            prepared = await asyncio.to_thread(self.service.prepare, name, inputs, outputs=outputs)
        else:
            prepared = self.service.prepare(name, inputs, outputs=outputs)
        cached = prepared.cached()
        if cached is not None:
            return _answer(name, cached)
        servable = prepared.servable
        if isinstance(servable, PipelineServable) and prepared.rows > 1 and servable.pipeline.tokenizes:
            runs = servable.runs(prepared.staged)  # type: ignore[arg-type]
            if len(runs) > 1:
                return await self._batched_runs(batcher, name, prepared, runs, encode, within)
        if self._offload_cache:  # its store leaves the process: in a thread of its own, not the batch's
            (everything, device), waited = await batcher.predict(prepared.feed, _with_device, within)
            answer = _answer(name, await asyncio.to_thread(self.service.finish, prepared, everything, device))
        else:
            # Finished and encoded in the batch's thread: off the event loop, which would otherwise write each of
            # the batch's answers in turn while requests wait to be read.
            then = EncodedAnswer(self.service, name, prepared, encode)
            answer, waited = await batcher.predict(prepared.feed, then, within)
        answer.timings["queue"] = round(waited * 1e3, 3)
        return answer

    async def _batched_runs(
        self,
        batcher: AdaptiveBatcher,
        name: str,
        prepared: Prepared,
        runs: TokenRuns,
        encode: Callable[[Answer], Any] | None,
        within: float | None,
    ) -> Answer:
        """A request of many texts through its model's batcher in the runs its tokens are cut into, so that its size
        never decides the process's memory: as many at once as the model runs batches at once, each finished where
        it ran, and the requests of their own that come meanwhile first (an ingest's runs never queue a query
        behind them). Refused as soon as what is left cannot end before the request's deadline."""
        servable = prepared.servable
        assert isinstance(servable, PipelineServable)
        window = batcher.policy.max_concurrent
        foresight = Foresight(runs.total, servable.pace, window)
        parts: list[Arrays | None] = [None] * len(runs)
        device = None
        running: dict[asyncio.Task[tuple[Any, float]], int] = {}
        waited = 0.0
        started = time.monotonic()
        try:
            ahead = 0
            while ahead < len(runs) or running:
                while ahead < len(runs) and len(running) < window:
                    foresight.check()
                    part = runs.part(ahead)
                    then = functools.partial(_run_finished, servable, part, prepared.names, prepared.timings)
                    latest = foresight.latest_start()
                    call = batcher.predict(part.feed, then, within, bulk=True, admitted=ahead > 0, latest=latest)
                    running[asyncio.ensure_future(call)] = ahead
                    ahead += 1
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = running.pop(task)
                    (parts[i], device), queued = task.result()
                    waited = waited or queued  # the wait before its first run: what a caller sees as queueing
                    foresight.ran(runs.tokens[i])
        finally:
            for task in running:
                task.cancel()
        servable.pace.add(runs.total, (time.monotonic() - started) * window)
        answer = await asyncio.to_thread(self._assembled, name, prepared, parts, runs, encode, device)
        answer.timings["queue"] = round(waited * 1e3, 3)
        return answer

    def _assembled(
        self,
        name: str,
        prepared: Prepared,
        parts: list[Arrays | None],
        runs: TokenRuns,
        encode: Callable[[Answer], Any] | None,
        device: str | None,
    ) -> Answer:
        """A request's finished runs as one answer, cached and encoded (off the event loop: a large answer takes
        a while to write)."""
        answer = _answer(name, self.service.finish_runs(prepared, parts, runs.order, device))  # type: ignore[arg-type]
        return _encoded(answer, encode)

    def _version_of(self, name: str, version: str | None) -> str:
        """The version a request to ``name`` is counted under (:attr:`Catalog.counted` when it names none)."""
        return version if version is not None else self._counted.get(name, "")

    async def _cascade(self, name: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None) -> Answer:
        assert self.cascades is not None
        result = await self._call(self.cascades.infer, name, inputs, outputs)
        answer = _answer(name, result.prediction)
        answer.parameters.update(answered_by=result.prediction.model, followup_status=result.status)
        if result.followup_id is not None:
            answer.parameters.update(followup_id=result.followup_id, followup_url=f"/v2/results/{result.followup_id}")
        return answer

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs) if self.offload else fn(*args, **kwargs)

    # -- results --------------------------------------------------------------------------------

    async def result(self, result_id: str, wait: float = 0.0) -> ResultState:
        """A stored result (cascade follow-up or batch job); ``wait`` seconds of long poll while pending.

        Unknown and expired ids are a :class:`ResultNotFound`.
        """
        if self.results is None:
            raise ResultNotFound("results are not stored here (no results table is configured)")
        state = await self.results.wait(result_id, wait)
        if state.state == "unknown":
            raise ResultNotFound(f"result {result_id!r} not found")
        if state.state == "expired":
            raise ResultNotFound(f"result {result_id!r} not found: it expired")
        return state

    async def close(self) -> None:
        """Stop the batchers (requests waiting in them are cancelled)."""
        for batcher in self.batchers.values():
            await batcher.close()


class EncodedAnswer:
    """What runs after a batched request's model, in the thread that ran its batch: the service's finish (a
    pipeline's post steps, the cache's store), then its transport's encoding, timed, in the answer's ``encoded``."""

    __slots__ = ("_service", "_name", "_prepared", "_encode")

    def __init__(
        self, service: InferenceService, name: str, prepared: Prepared, encode: Callable[[Answer], Any] | None
    ) -> None:
        self._service = service
        self._name = name
        self._prepared = prepared
        self._encode = encode

    def __call__(self, outputs: Arrays, device: str | None) -> Answer:
        return _encoded(_answer(self._name, self._service.finish(self._prepared, outputs, device)), self._encode)


def _with_device(outputs: Arrays, device: str | None) -> tuple[Arrays, str | None]:
    """A batched request's outputs as they are, with the device that ran them (finished elsewhere)."""
    return outputs, device


def _run_finished(
    servable: PipelineServable,
    part: Staged,
    names: Sequence[str],
    timings: dict[str, float] | None,
    outputs: Arrays,
    device: str | None,
) -> tuple[Arrays, str | None]:
    """One run of a request's texts finished (its post steps), where the run was, with the device that ran it."""
    return servable.finish(part, outputs, names, timings), device


def _encoded(answer: Answer, encode: Callable[[Answer], Any] | None) -> Answer:
    """``answer`` with its transport's encoding of it, timed, in its ``encoded`` (where the transport gave one)."""
    if encode is not None:
        started = time.perf_counter()
        payload = encode(answer)
        answer.encoded = (payload, round((time.perf_counter() - started) * 1e3, 3))
    return answer


def _answer(name: str, prediction: Prediction) -> Answer:
    parameters = {} if prediction.cache == "off" else {"cache": prediction.cache}
    answer = Answer(name, prediction.model, prediction.version, prediction.outputs, prediction.cache, parameters)
    answer.device = prediction.device
    if prediction.timings:
        answer.timings = {stage: round(ms, 3) for stage, ms in prediction.timings.items()}
    return answer
