"""What a served name runs: a model, or a pipeline of steps around one, behind one interface.

The service asks every servable the same things, whatever it is: check a request's tensors
(:meth:`Servable.validate`), name the outputs it gets (:meth:`Servable.requested`), turn it into its
model's feed (:meth:`Servable.stage`: a pipeline's pre steps), and turn the model's outputs into its
answer (:meth:`Servable.finish`: a pipeline's post steps); :meth:`Servable.run` does all of it for a
whole batch, in chunks of the model's ``max_batch_size``. The adaptive batcher runs the model
between ``stage`` and ``finish``, over the feeds of many requests. Cascades are routing between two
servables, in :mod:`fnserve.core.jobs.cascade`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

from fnserve.core.codec.rows import batch_size
from fnserve.core.codec.validation import check
from fnserve.core.errors import FnserveError, InferenceError, InvalidInput
from fnserve.core.execution.deadline import A_REQUEST, Foresight, TokenPace, TooManyTokens
from fnserve.core.execution.embeddings import MAX_REQUEST_TOKENS, TOKENS, TokenBudget, token_runs
from fnserve.core.execution.pipeline import Pipeline, Staged, concatenate
from fnserve.core.models.datatypes import Arrays
from fnserve.core.models.registry import LoadedModel, TensorSpec, requested_outputs

logger = logging.getLogger(__name__)


class Ran(NamedTuple):
    """A run's outputs, and the device that computed them where that is worth saying (a GPU, a mixed-device pool;
    None: this process's CPU)."""

    outputs: Arrays
    device: str | None


class Servable:
    """A model served under its own name: its tensors are the graph's."""

    kind: ClassVar[str] = "model"
    timed: ClassVar[bool] = False  # whether its answers time stages of their own (a pipeline's pre and post steps)

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self._serve(model.name, model.inputs, model.outputs, model.version, model.settings.cache_ttl_seconds)

    def _serve(
        self,
        name: str,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        version_key: str,
        ttl: int | None,
    ) -> None:
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.input_names = tuple(spec.name for spec in inputs)
        self.output_names = tuple(spec.name for spec in outputs)
        self.output_set = frozenset(self.output_names)
        self.version_key = version_key  # what a cache key says of the version
        self.ttl = ttl  # None: not cached
        # Jobs stack only where every tensor is batch-first (an output whose first dimension the graph fixes, a
        # reduction over the batch, could not be split back by rows) and the model's manifest entry lets them.
        self.batch_first = all(spec.shape and spec.shape[0] == -1 for spec in (*inputs, *outputs))
        self.stackable = self.batch_first and self.model.settings.stack_requests
        # A server runs the requests of one turn of its event loop together (core/serving/turns.py) only on a CPU,
        # where a batch of a new size costs no more than its rows. On a GPU each new input shape is a new plan (cuDNN's
        # algorithm search, a CUDA graph's capture), and joining turns there cuts throughput many times over
        # (docs/design/gpu-shapes.md). There only the adaptive batcher joins requests, into the batch sizes it warmed.
        self.joins_turns = self.stackable and self.model.placement.device == "cpu"
        self._padded = frozenset(self.model.settings.pad_inputs)
        self.budget = TokenBudget.of(self.model.settings)  # what one run may hold (None: its rows alone)
        self.pace = TokenPace()  # seconds a padded token of this servable's runs (a deadline's foresight)

    @property
    def what(self) -> str:
        """``model 'x'`` or ``pipeline 'x'``, for messages."""
        return f"{self.kind} {self.name!r}"

    def validate(self, inputs: Mapping[str, Any]) -> tuple[Arrays, int]:
        """Names, datatypes and shapes checked against the inputs: the feed and its batch size, or a 422."""
        return check(self.inputs, self.kind, self.name, inputs, strings=True)

    def requested(self, outputs: Sequence[str] | None) -> tuple[str, ...]:
        """The outputs a request gets (all when it names none, each once), or the 422 for names it lacks."""
        if outputs is None:
            return self.output_names
        return requested_outputs(self.kind, self.name, self.output_names, self.output_set, outputs)

    def stage(self, feed: Arrays, timings: dict[str, float] | None = None) -> Staged:
        """A validated request as its model's feed."""
        return Staged(feed, feed)

    def finish(
        self, staged: Staged, outputs: Mapping[str, np.ndarray[Any, Any]], names: Sequence[str], timings: Any = None
    ) -> Arrays:
        """The requested outputs, from the model's outputs for this request's rows."""
        return {name: outputs[name] for name in names}

    def run(self, feed: Arrays, batch: int, names: Sequence[str], timings: dict[str, float] | None = None) -> Ran:
        """A validated batch end to end, in chunks of at most the model's ``max_batch_size`` rows."""
        model = self.model
        limit = model.settings.max_batch_size
        budget = self.budget
        if budget is not None:  # rows padded alike: as many a chunk as the budget holds at their length
            limit = budget.rows(limit, max((a.shape[1] for n, a in feed.items() if n in self._padded), default=0))
        if batch <= limit:
            results, device = run_model(model, names, feed)
        else:
            chunks = [
                run_model(model, names, {k: v[start : start + limit] for k, v in feed.items()})
                for start in range(0, batch, limit)
            ]
            results = [np.concatenate(parts) for parts in zip(*(chunk for chunk, _ in chunks), strict=True)]
            device = chunks[-1][1]
        return Ran(dict(zip(names, results, strict=True)), device)

    def metadata(self) -> dict[str, Any]:
        """V2 model metadata (without the versions, which only the registry knows)."""
        return {
            "name": self.name,
            "platform": "onnxruntime_onnx",
            "inputs": [input_metadata(spec) for spec in self.inputs],
            "outputs": [spec.to_metadata() for spec in self.outputs],
            "parameters": self.model.placement.to_metadata(),
        }


class PipelineServable(Servable):
    """A pipeline: its own tensors (text or images in, labels or embeddings out), its steps around its model."""

    kind: ClassVar[str] = "pipeline"
    timed: ClassVar[bool] = True

    def __init__(self, pipeline: Pipeline) -> None:
        self.model = pipeline.model
        self.pipeline = pipeline
        settings = pipeline.settings
        self._serve(pipeline.name, pipeline.inputs, pipeline.outputs, pipeline.version_key, settings.cache_ttl_seconds)
        self.output_set = pipeline.output_set  # its outputs, and what its pre steps made, when asked by name
        self._token_inputs = frozenset(pipeline.token_inputs)  # what a run of its texts cuts to its own longest

    def validate(self, inputs: Mapping[str, Any]) -> tuple[Arrays, int]:
        # BYTES stay as sent (text or image bytes): the steps decide what they are.
        return check(self.inputs, self.kind, self.name, inputs, strings=False)

    def stage(self, feed: Arrays, timings: dict[str, float] | None = None) -> Staged:
        staged = self.pipeline.stage(feed, timings)
        staged.feed = check(self.model.inputs, "model", self.model.name, staged.feed, strings=True)[0]
        return staged

    def finish(
        self,
        staged: Staged,
        outputs: Mapping[str, np.ndarray[Any, Any]],
        names: Sequence[str],
        timings: dict[str, float] | None = None,
    ) -> Arrays:
        return self.pipeline.finish(staged, outputs, names, timings)

    def run(self, feed: Arrays, batch: int, names: Sequence[str], timings: dict[str, float] | None = None) -> Ran:
        """Pre steps, model, post steps, chunk by chunk of at most the model's ``max_batch_size`` rows
        (rows of like length together, then put back in order); texts by their tokens, where the pipeline
        tokenizes (:meth:`_run_by_tokens`)."""
        pipeline = self.pipeline
        if batch > 1 and pipeline.tokenizes:
            return self._run_by_tokens(feed, names, timings)
        order = pipeline.order(feed, batch)
        if order is not None:
            feed = {name: array[order] for name, array in feed.items()}
        parts = []
        device = None
        for chunk in pipeline.chunks(feed, batch):
            staged = self.stage(chunk, timings)
            run, device = run_model(self.model, pipeline.model_outputs, staged.feed)
            parts.append(pipeline.finish(staged, dict(zip(pipeline.model_outputs, run, strict=True)), names, timings))
        result = concatenate(parts, self.what)
        return Ran(result if order is None else in_order(result, order), device)

    def _run_by_tokens(self, feed: Arrays, names: Sequence[str], timings: dict[str, float] | None) -> Ran:
        """A batch of texts tokenized in one call, run in the :meth:`runs` its tokens are cut into, then put back
        in order; refused as soon as what is left cannot end before the request's deadline."""
        pipeline, model = self.pipeline, self.model
        runs = self.runs(self.stage(feed, timings))
        foresight = Foresight(runs.total, self.pace)
        parts = []
        device = None
        for i in range(len(runs)):
            foresight.check()
            part = runs.part(i)
            started = time.perf_counter()
            run, device = run_model(model, pipeline.model_outputs, part.feed)
            self.pace.add(runs.tokens[i], time.perf_counter() - started)
            foresight.ran(runs.tokens[i])
            parts.append(pipeline.finish(part, dict(zip(pipeline.model_outputs, run, strict=True)), names, timings))
        return Ran(in_order(concatenate(parts, self.what), runs.order), device)

    def runs(self, staged: Staged) -> TokenRuns:
        """A tokenized batch cut into runs: sorted by token count, chunks that the model's budget holds (None: no
        bound but the rows) of at most ``max_batch_size`` rows, of which at least ``MIN_FILL`` of the padded tokens
        are real, each padded only to its own longest text. So a process's working memory is bounded by the budget,
        whatever a request holds; padded to the whole batch's longest, a query beside a passage would cost the
        passage's run. More real tokens than a request may hold (``MAX_REQUEST_TOKENS``) are refused."""
        counts = staged.context[TOKENS]
        total = int(counts.sum())
        if total > MAX_REQUEST_TOKENS and A_REQUEST.get():  # a request's bound, not a batch of jobs
            raise TooManyTokens(
                f"this request holds {total} tokens, more than the {MAX_REQUEST_TOKENS} a request may; send its "
                "texts in several requests, or submit them as batch jobs (fnserve submit)"
            )
        order = np.argsort(counts, kind="stable")
        ends = token_runs(counts[order].tolist(), self.budget, self.model.settings.max_batch_size)
        return TokenRuns(staged, order, ends, self._token_inputs)

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "platform": "fnserve_pipeline",
            "inputs": [input_metadata(spec) for spec in self.inputs],
            "outputs": [spec.to_metadata() for spec in self.outputs],
        }


class TokenRuns:
    """A tokenized batch cut into runs (:meth:`PipelineServable.runs`): the order its rows run in, and each run's
    padded tokens; :meth:`part` makes a run's feed when it is about to run, so a request's runs are never all held
    padded at once."""

    __slots__ = ("staged", "order", "ends", "tokens", "total", "_padded", "_longest")

    def __init__(self, staged: Staged, order: np.ndarray[Any, Any], ends: Sequence[int], padded: frozenset[str]):
        self.staged = staged
        self.order = order
        self.ends = ends
        self._padded = padded
        counts = staged.context[TOKENS][order]
        starts = [0, *ends[:-1]]
        # The rows are sorted: a run's longest is its last.
        self._longest = [max(int(counts[end - 1]), 1) for end in ends]
        self.tokens = [longest * (end - start) for start, end, longest in zip(starts, ends, self._longest, strict=True)]
        self.total = sum(self.tokens)

    def __len__(self) -> int:
        return len(self.ends)

    def part(self, i: int) -> Staged:
        """Run ``i``'s rows, its padded inputs cut to its own longest text."""
        chunk = self.order[self.ends[i - 1] if i else 0 : self.ends[i]]
        longest, staged = self._longest[i], self.staged
        cut = {
            name: array[chunk][:, :longest] if name in self._padded and array.ndim >= 2 else array[chunk]
            for name, array in {**staged.context, **staged.feed}.items()  # the feed as checked for the model
        }
        return Staged({name: cut[name] for name in staged.feed}, cut)


def in_order(result: Arrays, order: np.ndarray[Any, Any]) -> Arrays:
    """Rows run in ``order`` put back where the request had them."""
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return {name: array[back] for name, array in result.items()}


def input_metadata(spec: TensorSpec) -> dict[str, object]:
    """An input's V2 metadata; one value a row (a pipeline's text) is ``[-1, 1]``, as Triton describes it
    (dims [1] reshaped to []): Triton's tools shape what they send from it, and validation takes ``[n, 1]``
    as ``[n]``. ``[n]`` stays as good."""
    meta = spec.to_metadata()
    if spec.shape == (-1,):
        meta["shape"] = [-1, 1]
    return meta


def run_model(model: LoadedModel, names: Sequence[str], feed: Arrays) -> tuple[list[np.ndarray[Any, Any]], str | None]:
    """One ``session.run``, and the device that ran it (:class:`Ran`'s); its errors as the client's (422) or the
    server's (500)."""
    session = model.session
    placed = None if model.placement.device == "cpu" else model.placement.device
    started = time.perf_counter_ns()
    try:
        run_on = getattr(session, "run_on", None)  # a pool's session: it says which of its devices ran the call
        if run_on is None:
            outputs, device = session.run(names, feed), placed
        else:
            outputs, device = run_on(names, feed)
            device = device or placed
    except FnserveError:
        raise
    except Exception as exc:
        raise runtime_error(model.name, exc) from exc
    model.executions.ran(batch_size(feed), time.perf_counter_ns() - started)
    return outputs, device


# What onnxruntime says when the fault is the machine's, not the input's: memory, a device, its libraries.
_MACHINE_FAULT = re.compile(r"out of memory|failed to allocate|bad_alloc|cuda|cudnn|cublas|tensorrt|rocm", re.I)
_SOURCE_LINE = re.compile(r"^\S+\.(?:h|cc|cpp|cu):\d+ (?:.*? was false\. )?")
_NODE = re.compile(
    r"Non-zero status code returned while running (\S+) node\. Name:'([^']*)' Status Message: (.*)", re.S
)


def runtime_error(model: str, exc: Exception) -> FnserveError:
    """An error raised by ``session.run``, as the client's or the server's.

    Input that passed validation but that the graph cannot run (a token id past the vocabulary, a
    sequence longer than the position table, a shape an inner node constrains) fails in a kernel:
    onnxruntime's INVALID_ARGUMENT, or FAIL "while running <op> node". That is the input's fault
    (422, with the runtime's reason); memory, devices and anything else are the server's (500).
    """
    text = str(exc)
    kernel = "returned while running" in text
    if isinstance(exc, InvalidArgument) or (isinstance(exc, Fail | RuntimeException) and kernel):
        if not _MACHINE_FAULT.search(text):
            return InvalidInput(f"model {model!r} cannot run this input: {_reason(text)}")
    logger.error("inference failed in model %r", model, exc_info=exc)
    return InferenceError(f"inference failed in model {model!r}")


def _reason(text: str) -> str:
    """onnxruntime's message without its error-code prefix and source locations: the node and what it says."""
    text = text.split(" : ", 3)[-1] if text.startswith("[ONNXRuntimeError]") else text
    node = _NODE.match(text)
    if node is None:
        return text.strip()
    op, name, message = node.groups()
    return f"{op} node {name!r}: {_SOURCE_LINE.sub('', message.strip())}"
