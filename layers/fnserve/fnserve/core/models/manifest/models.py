"""A model's entry: one model version, its file and digests, its tensor overrides, its providers, threads and
batching."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fnserve.core.models.manifest.entries import Entry, data_file_name, sha256_hex
from fnserve.core.models.manifest.providers import CudaProvider, Provider
from fnserve.core.models.names import check_name

ModelName = Annotated[str, Meta(min_length=1, max_length=128)]


class TensorOverride(Entry, frozen=True, kw_only=True):
    """What the manifest may say about one input or output beyond what the ONNX graph says."""

    shape: (
        Annotated[
            list[int],
            Meta(
                description="Shape to advertise and enforce (-1 for a variable dimension); must have the "
                "graph's rank and agree with its fixed dimensions."
            ),
        ]
        | None
    ) = None


class ModelSettings(Entry, frozen=True, kw_only=True):
    """One model version in the manifest."""

    name: Annotated[ModelName, Meta(description="Model name used in URLs and job records.")]
    version: Annotated[str, Meta(description="Version label; the highest is the default.")] = "1"
    path: Annotated[
        str, Meta(description="ONNX file: a path relative to the manifest, an absolute path, or s3://bucket/key.")
    ]
    sha256: Annotated[str, Meta(description="Hex SHA-256 of the ONNX file; a mismatch refuses the load.")]
    external_data: Annotated[
        dict[str, str],
        Meta(
            description="The files beside the ONNX file that its graph keeps tensors in (external data), each by the "
            "name the graph gives it (relative to the ONNX file's folder) with its hex SHA-256: checked like the "
            "ONNX file's, and fetched or pushed beside it. `fnserve manifest add` writes it."
        ),
    ] = {}
    description: Annotated[str, Meta(description="Free text shown in model metadata.")] = ""
    inputs: Annotated[
        dict[str, TensorOverride], Meta(description="Per-input overrides, keyed by the graph's input name.")
    ] = {}
    outputs: Annotated[
        dict[str, TensorOverride], Meta(description="Per-output overrides, keyed by the graph's output name.")
    ] = {}
    max_batch_size: Annotated[
        int, Meta(ge=1, description="Largest batch sent to the runtime in one call; bigger requests are chunked.")
    ] = 1024
    intra_op_threads: (
        Annotated[
            int, Meta(ge=1, description="ONNX Runtime intra-op threads; default: available CPUs / worker processes.")
        ]
        | None
    ) = None
    inter_op_threads: Annotated[int, Meta(ge=1, description="ONNX Runtime inter-op threads.")] = 1
    execution_providers: Annotated[
        list[Provider],
        Meta(
            min_length=1,
            description="ONNX Runtime execution providers in order of preference: a name, or a table with the name "
            "and its options (CUDAExecutionProvider, TensorrtExecutionProvider).",
        ),
    ] = msgspec.field(default_factory=lambda: list[Provider](["CPUExecutionProvider"]))
    cpu_fallback: Annotated[
        bool,
        Meta(
            description="Run on the CPU, with a warning, when a GPU provider asked for cannot be created; "
            "otherwise that stops the start."
        ),
    ] = False
    graph_optimization: Annotated[
        Literal["disable", "basic", "extended", "all"], Meta(description="ONNX Runtime graph optimisation level.")
    ] = "all"
    max_batch_time_ms: (
        Annotated[
            float,
            Meta(
                gt=0,
                description="Adaptive batching in long-running servers: gather concurrent requests for at most this "
                "long after the first one (and at most max_batch_size rows), and only while more are on their way "
                "(as many as were in flight lately): a lone request runs at once; off when unset.",
            ),
        ]
        | None
    ) = None
    stack_requests: Annotated[
        bool,
        Meta(
            description="Whether separate requests to this model may run stacked in one call (when every input and "
            "output is batch-first): an SQS batch's jobs, and in long-running servers the requests that arrive "
            "together (decoded in one turn of the event loop; nothing waits for more). Set false for a graph whose "
            "rows are not independent, where one row's outputs depend on the others'."
        ),
    ] = True
    priority: Annotated[
        int,
        Meta(
            ge=0,
            le=9,
            description="Between models served by the same processes, higher first: in `fnserve serve`, its calls go "
            "before the queued calls of lower priority models for the same workers, and its batches run in the front "
            "process on threads the OS favours over theirs (a lower priority's threads are niced 5 per level below "
            "the highest).",
        ),
    ] = 0
    max_queue_size: (
        Annotated[
            int,
            Meta(
                ge=1,
                description="Adaptive batching: a bound on the rows that wait for a batch, beside "
                "max_queue_delay_ms; a request that would go past it is refused at once (503 with Retry-After, gRPC "
                "UNAVAILABLE). Unset: none, the wait bounds the queue. A bound near max_batch_size refuses some "
                "requests of more clients than a batch whenever the batch running is not full, though they would be "
                "answered in time.",
            ),
        ]
        | None
    ) = None
    max_queue_delay_ms: (
        Annotated[
            float,
            Meta(
                gt=0,
                description="Adaptive batching: the longest a request waits for its batch. One whose rows ahead "
                "would take longer, at the pace of the latest runs, is refused as it arrives, before its body is "
                "read, and so is one foreseen to be answered past its client's own deadline (a gRPC deadline, "
                "Triton's timeout parameter); one still waiting this long after it arrived is refused then (503 with "
                "Retry-After, gRPC UNAVAILABLE), never run. Unset: 1000, or for a model slower than that, twice a "
                "full batch's run at the latest pace (a queue of one batch always fits). Clients that each wait for "
                "their answer before sending again are not refused while their requests wait less than this, however "
                "many they are; under overload the answered ones wait up to it.",
            ),
        ]
        | None
    ) = None
    length_buckets: Annotated[
        list[int],
        Meta(description="Sequence lengths that batched variable-length inputs are padded up to (sorted, positive)."),
    ] = []
    batch_buckets: Annotated[
        list[int],
        Meta(
            description="Batch sizes that adaptive batches are padded up to (sorted, positive): a GPU then sees a few "
            "shapes, each warmed at start (cuDNN's algorithm search, TensorRT's engine)."
        ),
    ] = []
    pad_inputs: Annotated[
        list[str],
        Meta(description="Inputs padded along axis 1 (to their bucket, when batched): the lengths a budget counts."),
    ] = []
    max_batch_tokens: (
        Annotated[
            int,
            Meta(
                ge=1,
                description="A run of variable-length inputs (pad_inputs) holds at most this many padded tokens "
                "(its longest text's length, or that length's bucket, times its rows), on every road: a request's "
                "texts are cut into runs it holds, so a process's memory is bounded by it, never by a request. "
                "With adaptive batching, requests of every length then wait in one queue (as with "
                "max_batch_attention): a batch takes the oldest, then those nearest its length. Unset (both): a "
                "queue a length bucket, a batch cut by max_batch_size alone.",
            ),
        ]
        | None
    ) = None
    max_batch_attention: (
        Annotated[
            int,
            Meta(
                ge=1,
                description="With or without max_batch_tokens: a run of variable-length inputs (pad_inputs) holds "
                "at most this many rows times its longest length squared (the scores each attention head "
                "computes), on every road, adaptive batches included. Past the CPU's cache a bigger batch of long "
                "texts costs more a text than runs of fewer; short texts still batch by the dozen.",
            ),
        ]
        | None
    ) = None
    pad_value: Annotated[float, Meta(description="Value the padding is filled with.")] = 0.0
    cache_ttl_seconds: (
        Annotated[
            int,
            Meta(
                ge=1, description="Cache this model's results for this long (in-process and DynamoDB); off when unset."
            ),
        ]
        | None
    ) = None
    session_per_shape: Annotated[
        bool,
        Meta(
            description="One ONNX Runtime session per batch shape (batch_buckets x length_buckets), so a change of "
            "shape never rebuilds a session's plans (CNNs on the CUDA provider pay ~200 ms at each); weights are held "
            "once per session."
        ),
    ] = False
    warmup: Annotated[
        bool,
        Meta(
            description="Run one zero-filled batch at load, so the first request does not pay the "
            "runtime's first-run allocations."
        ),
    ] = True

    @property
    def cuda_graphs(self) -> bool:
        """Whether its CUDA provider asks for one CUDA graph per batch shape."""
        return any(isinstance(p, CudaProvider) and p.cuda_graph for p in self.execution_providers)

    def __post_init__(self) -> None:
        check_name(self.name, "model name")
        check_name(self.version, "model version")
        msgspec.structs.force_setattr(self, "sha256", sha256_hex(self.sha256))
        external = {
            data_file_name(name): sha256_hex(digest, f"external_data {name!r}: sha256")
            for name, digest in self.external_data.items()
        }
        msgspec.structs.force_setattr(self, "external_data", external)
        if self.path.startswith("s3://"):
            bucket, _, key = self.path[5:].partition("/")
            if not bucket or not key:
                raise ValueError(f"s3 path {self.path!r} must be s3://bucket/key")
        elif not self.path:
            raise ValueError("path must not be empty")
        self._check_batching()
        self._check_overrides()

    def _check_batching(self) -> None:
        if any(b < 1 for b in self.length_buckets) or self.length_buckets != sorted(set(self.length_buckets)):
            raise ValueError(f"length_buckets must be positive and ascending, got {self.length_buckets}")
        if self.pad_inputs and not self.length_buckets and self.max_batch_time_ms is not None:
            raise ValueError("pad_inputs needs length_buckets to pad up to")
        if any(b < 1 for b in self.batch_buckets) or self.batch_buckets != sorted(set(self.batch_buckets)):
            raise ValueError(f"batch_buckets must be positive and ascending, got {self.batch_buckets}")
        if self.batch_buckets and self.batch_buckets[-1] > self.max_batch_size:
            raise ValueError(
                f"batch_buckets go up to {self.batch_buckets[-1]}, over max_batch_size {self.max_batch_size}"
            )
        graphs = self.cuda_graphs
        for wanted, what in ((self.session_per_shape, "session_per_shape"), (graphs, "cuda_graph")):
            if wanted and not self.batch_buckets:
                raise ValueError(f"{what} needs batch_buckets: the fixed batch shapes it keeps one of each for")
        if self.session_per_shape and graphs:
            raise ValueError("cuda_graph already keeps one graph per shape: leave session_per_shape out")
        budgeted = self.max_batch_tokens is not None or self.max_batch_attention is not None
        if (self.length_buckets or self.batch_buckets) and self.max_batch_time_ms is None:
            raise ValueError("length_buckets and batch_buckets only apply with max_batch_time_ms (adaptive batching)")
        if self.pad_inputs and self.max_batch_time_ms is None and not budgeted:
            raise ValueError(
                "pad_inputs only apply with max_batch_time_ms (adaptive batching) or a token budget "
                "(max_batch_tokens, max_batch_attention)"
            )
        for budget in ("max_batch_tokens", "max_batch_attention"):
            if getattr(self, budget) is not None and not self.pad_inputs:
                raise ValueError(f"{budget} needs pad_inputs: the variable-length inputs whose tokens it counts")
        if not self.stack_requests and self.max_batch_time_ms is not None:
            raise ValueError("max_batch_time_ms (adaptive batching) stacks requests: it needs stack_requests")
        queueing = [name for name in ("max_queue_delay_ms", "max_queue_size") if getattr(self, name) is not None]
        if queueing and self.max_batch_time_ms is None:
            raise ValueError(f"{' and '.join(queueing)} only apply with max_batch_time_ms (adaptive batching)")

    def _check_overrides(self) -> None:
        for kind, overrides in (("input", self.inputs), ("output", self.outputs)):
            for tensor, override in overrides.items():
                if override.shape is not None and any(d < -1 or d == 0 for d in override.shape):
                    raise ValueError(
                        f"{kind} {tensor!r}: shape dimensions must be positive or -1, got {override.shape}"
                    )
