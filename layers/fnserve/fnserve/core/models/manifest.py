"""The manifest format: every model version a deployment serves, its tensor overrides, its pipelines
(steps around a model) and its cascades.

A leaf: it knows msgspec and nothing of the features that read it. Each entry is a frozen ``msgspec.Struct``
validated from the parsed file by msgspec's compiled validator (``Entry.validate``), not by pydantic models, whose
import and build would weigh on every cold start (docs/design/start.md). TOML is what people
write; JSON (a TOML-shaped document) is what fnserve writes itself (an s3:// manifest fetched).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Self

import msgspec
from msgspec import Meta

from fnserve.core.errors import ConfigError
from fnserve.core.models.names import check_name

ModelName = Annotated[str, Meta(min_length=1, max_length=128)]


def _decode(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    raise ValueError(f"Expected `str`, got `{type(value).__name__}`")  # msgspec adds where


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A manifest entry: frozen, and every field the file gives must be one it knows."""

    @classmethod
    def validate(cls, data: Any) -> Self:
        """``data`` (a parsed TOML or JSON table) as this entry; :class:`msgspec.ValidationError` says what is
        wrong and where (``$.models[0].max_batch_size``)."""
        return msgspec.convert(data, cls, dec_hook=_decode)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (not validated again: the caller's values are already entries)."""
        return msgspec.structs.replace(self, **changes)


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


class _Provider(Entry, tag_field="name", frozen=True):
    @property
    def name(self) -> str:
        """The provider's name in ONNX Runtime, which the manifest's table gives as ``name``."""
        return str(type(self).__struct_config__.tag)


class CudaProvider(_Provider, tag="CUDAExecutionProvider", frozen=True, kw_only=True):
    """ONNX Runtime's CUDA execution provider, with its options."""

    device_id: Annotated[int, Meta(ge=0, description="The GPU this model runs on.")] = 0
    memory_limit_mb: (
        Annotated[int, Meta(ge=1, description="Most GPU memory the session's arena may take; none: no limit.")] | None
    ) = None
    cudnn_conv_algo_search: Annotated[
        Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"],
        Meta(
            description="How cuDNN picks convolution algorithms: EXHAUSTIVE measures each (once per shape, at "
            "warm-up), HEURISTIC guesses."
        ),
    ] = "EXHAUSTIVE"
    copy_streams: Annotated[
        bool, Meta(description="Copies to and from the GPU on their own streams, overlapping compute.")
    ] = True
    cuda_graph: Annotated[
        bool,
        Meta(
            description="Capture one CUDA graph per batch shape (batch_buckets x length_buckets) and replay it: far "
            "less launch overhead at small batches, and no cost at a change of shape. Every node must run on CUDA."
        ),
    ] = False


class TensorrtProvider(_Provider, tag="TensorrtExecutionProvider", frozen=True, kw_only=True):
    """ONNX Runtime's TensorRT execution provider, with its options."""

    device_id: Annotated[int, Meta(ge=0, description="The GPU this model runs on.")] = 0
    fp16: Annotated[bool, Meta(description="Let TensorRT run layers in FP16.")] = False
    int8: Annotated[
        bool,
        Meta(
            description="Let TensorRT run layers in INT8: for a model with symmetric QuantizeLinear/DequantizeLinear "
            "nodes, whose scales TensorRT reads. A dynamically quantized model has none: use fp16 for it."
        ),
    ] = False
    cache_dir: (
        Annotated[
            str,
            Meta(
                description="Where built engines and the timing cache are kept, so later starts skip the build: a "
                "writable folder, made and checked at start, shared by the workers and kept across restarts."
            ),
        ]
        | None
    ) = None
    max_workspace_mb: Annotated[int, Meta(ge=1, description="TensorRT's workspace limit.")] | None = None
    min_shapes: Annotated[dict[str, list[int]], Meta(description="Shape profile: smallest shapes.")] = {}
    opt_shapes: Annotated[dict[str, list[int]], Meta(description="Shape profile: shapes tuned for.")] = {}
    max_shapes: Annotated[dict[str, list[int]], Meta(description="Shape profile: largest shapes.")] = {}

    def __post_init__(self) -> None:
        profiles = (self.min_shapes, self.opt_shapes, self.max_shapes)
        if any(profiles) and not all(p.keys() == self.min_shapes.keys() for p in profiles):
            raise ValueError("min_shapes, opt_shapes and max_shapes must name the same inputs")
        for name in self.min_shapes:
            low, opt, high = (p[name] for p in profiles)
            if not len(low) == len(opt) == len(high) or any(
                not 1 <= a <= b <= c for a, b, c in zip(low, opt, high, strict=True)
            ):
                raise ValueError(f"input {name!r}: the shape profile must have min <= opt <= max, all positive")


Provider = CudaProvider | TensorrtProvider | str  # a table is told apart by its name


def sha256_hex(value: str, what: str = "sha256") -> str:
    """A SHA-256 as the manifest keeps it: 64 hex digits, lowercased; ``what`` names it in the error."""
    if not re.fullmatch(r"[0-9a-f]{64}", value.lower()):
        raise ValueError(f"{what} must be 64 hex digits")
    return value.lower()


def data_file_name(name: str) -> str:
    """An external data file's name as the graph gives it, checked to stay below the model's folder (wherever that
    is: a bucket's prefix, the cache) and written plainly (``./w.bin`` as ``w.bin``)."""
    posix = PurePosixPath(name)
    if not name or "\\" in name or posix.is_absolute() or ".." in posix.parts or posix.as_posix() == ".":
        raise ValueError(
            f"external data file {name!r} must be a relative path below the model's folder ('/' between folders, "
            "no '..')"
        )
    return posix.as_posix()


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


class StepTensor(Entry, frozen=True, kw_only=True):
    """A tensor a custom step reads or writes, as V2 metadata shows it."""

    name: Annotated[str, Meta(min_length=1, description="Tensor name.")]
    datatype: Annotated[str, Meta(description="V2 datatype: FP32, INT64, BYTES, ...")]
    shape: Annotated[list[int], Meta(min_length=1, description="Shape, -1 where it varies; axis 0 is the batch.")]


class _Step(Entry, tag_field="step", frozen=True):
    """A pipeline step; the manifest's ``step`` says which."""

    @property
    def step(self) -> str:
        """Its kind, as the manifest names it (``tokenize``, ``mean_pool``, ...)."""
        return str(type(self).__struct_config__.tag)


class TokenizeStep(_Step, tag="tokenize", frozen=True, kw_only=True):
    """Text (BYTES, one string a row) -> the token tensors the model's graph takes, with `tokenizers`."""

    input: Annotated[str, Meta(description="The pipeline input holding the text: BYTES [-1].")] = "text"
    tokenizer: Annotated[str, Meta(description="A tokenizer.json (Hugging Face tokenizers), relative to the manifest.")]
    max_length: Annotated[int, Meta(ge=2, description="Longer texts are truncated to this many tokens.")] = 512
    truncate: Annotated[
        bool,
        Meta(
            description="Cut a text longer than max_length to its first tokens, as sentence-transformers does; false: "
            "refuse it (a 4xx naming the row)."
        ),
    ] = True
    ids: Annotated[str, Meta(description="The model input that takes the token ids.")] = "input_ids"
    attention_mask: Annotated[str, Meta(description="The model input that takes the mask.")] = "attention_mask"
    token_type_ids: Annotated[str, Meta(description="The model input that takes the type ids.")] = "token_type_ids"
    pair: (
        Annotated[
            str,
            Meta(
                description="The pipeline input holding each row's second text (BYTES [-1]), tokenized with the "
                "first as one sequence, as a cross-encoder reads a query and a document; past max_length the second "
                "is cut first, the first only beyond half the length."
            ),
        ]
        | None
    ) = None
    prompts: Annotated[
        dict[str, str],
        Meta(
            description="Named prompts, put before a text before it is tokenized, as sentence-transformers' prompts "
            '(e5: {query = "query: ", passage = "passage: "}); a request names one (OpenAI\'s and TEI\'s '
            "prompt_name)."
        ),
    ] = {}
    default_prompt: (
        Annotated[str, Meta(description="The prompt put before every text a request names none for.")] | None
    ) = None

    def __post_init__(self) -> None:
        if self.default_prompt is not None and self.default_prompt not in self.prompts:
            raise ValueError(f"default_prompt {self.default_prompt!r} is not one of the prompts {sorted(self.prompts)}")
        if self.pair is not None and self.prompts:
            raise ValueError("prompts are for embedders' single texts, not text pairs")
        if self.pair == self.input:
            raise ValueError("pair must name another input than the first text's")


class ImageStep(_Step, tag="image", frozen=True, kw_only=True):
    """Encoded images (JPEG, PNG or WebP bytes, one a row) -> one pixel tensor, with Pillow."""

    input: Annotated[str, Meta(description="The pipeline input holding the images: BYTES [-1].")] = "image"
    output: Annotated[str, Meta(description="The model input that takes the pixels.")]
    mode: Annotated[Literal["RGB", "L"], Meta(description="RGB (3 channels) or L (grayscale).")] = "RGB"
    resize: (
        Annotated[
            list[int] | int,
            Meta(description="[height, width], or the shorter side's length (aspect kept); none: as is."),
        ]
        | None
    ) = None
    crop: Annotated[list[int], Meta(description="[height, width] cut from the centre after resizing.")] | None = None
    resample: Annotated[
        Literal["nearest", "box", "bilinear", "bicubic", "lanczos"],
        Meta(description="Pillow's resampling filter (box: the mean of each block, exact on whole ratios)."),
    ] = "bilinear"
    dtype: Annotated[Literal["uint8", "float32"], Meta(description="Pixel type the model takes.")] = "float32"
    scale: Annotated[float, Meta(description="float32: pixels (0-255) are multiplied by this first...")] = 1.0 / 255.0
    mean: Annotated[list[float], Meta(description="...then this is subtracted (per channel)...")] = msgspec.field(
        default_factory=lambda: [0.0]
    )
    std: Annotated[list[float], Meta(description="...and the result divided by this.")] = msgspec.field(
        default_factory=lambda: [1.0]
    )
    layout: Annotated[
        Literal["NCHW", "NHWC", "flat"],
        Meta(description="NCHW, NHWC, or flat: [N, H*W*C] (a classic model's feature vector)."),
    ] = "NCHW"
    max_pixels: Annotated[int, Meta(ge=1, description="Larger images are refused (a decompression bomb guard).")] = (
        40_000_000
    )

    def __post_init__(self) -> None:
        for what, size in (("resize", self.resize), ("crop", self.crop)):
            if isinstance(size, list) and (len(size) != 2 or min(size) < 1):
                raise ValueError(f"{what} must be [height, width] of positive sizes, got {size}")
            if isinstance(size, int) and size < 1:
                raise ValueError(f"{what} must be positive, got {size}")
        channels = 3 if self.mode == "RGB" else 1
        for what, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, channels):
                raise ValueError(f"{what} needs 1 or {channels} values for mode {self.mode}, got {len(values)}")
        if any(v == 0 for v in self.std):
            raise ValueError("std must not be 0")


class SoftmaxStep(_Step, tag="softmax", frozen=True, kw_only=True):
    """Logits -> probabilities along the last axis."""

    input: Annotated[str, Meta(description="The tensor holding the logits.")]
    output: Annotated[str, Meta(description="Where the probabilities go (default: in place).")] | None = None


class TopKStep(_Step, tag="topk", frozen=True, kw_only=True):
    """Scores -> the k best classes per row: their labels (BYTES) and their scores (FP32)."""

    input: Annotated[str, Meta(description="The tensor holding the scores: [rows, classes].")]
    k: Annotated[int, Meta(ge=1, description="How many classes per row.")] = 5
    labels: (
        Annotated[
            str,
            Meta(
                description="A text file, one label a line in class order (relative to the manifest); "
                "none: the class indexes as text."
            ),
        ]
        | None
    ) = None
    labels_output: Annotated[str, Meta(description="Output name of the labels: BYTES [rows, k].")] = "labels"
    scores_output: Annotated[str, Meta(description="Output name of the scores: FP32 [rows, k].")] = "scores"


class MeanPoolStep(_Step, tag="mean_pool", frozen=True, kw_only=True):
    """Token embeddings -> one embedding per row: the mean over the attention mask, L2-normalised."""

    input: Annotated[str, Meta(description="The tensor of token embeddings: [rows, tokens, dim].")] = "token_embeddings"
    mask: Annotated[str, Meta(description="The mask the tokenize step made: [rows, tokens].")] = "attention_mask"
    output: Annotated[str, Meta(description="Output name: FP32 [rows, dim].")] = "embedding"
    normalize: Annotated[bool, Meta(description="Scale each embedding to unit length.")] = True


class PoolStep(_Step, tag="pool", frozen=True, kw_only=True):
    """Token embeddings -> one embedding per row, as sentence-transformers' Pooling module makes it."""

    mode: Annotated[
        Literal["mean", "cls", "max", "last_token"],
        Meta(
            description="mean: over the attention mask; cls: the first token's; max: each dimension's largest over "
            "the mask; last_token: the last unmasked token's (decoder embedders)."
        ),
    ] = "mean"
    input: Annotated[str, Meta(description="The tensor of token embeddings: [rows, tokens, dim].")] = "token_embeddings"
    mask: Annotated[str, Meta(description="The mask the tokenize step made: [rows, tokens].")] = "attention_mask"
    output: Annotated[str, Meta(description="Output name: FP32 [rows, dim].")] = "embedding"
    normalize: Annotated[bool, Meta(description="Scale each embedding to unit length.")] = True


class SigmoidStep(_Step, tag="sigmoid", frozen=True, kw_only=True):
    """Logits -> each one's own probability (a reranker's one logit, a multi-label classifier's)."""

    input: Annotated[str, Meta(description="The tensor holding the logits.")]
    output: Annotated[str, Meta(description="Where the probabilities go (default: in place).")] | None = None


class CustomStep(_Step, tag="custom", frozen=True, kw_only=True):
    """A Python function of the user's: a dict of arrays in (the tensors it reads), a dict of arrays out."""

    function: Annotated[str, Meta(description="module:function; the module is looked up beside the manifest first.")]
    inputs: Annotated[list[StepTensor], Meta(min_length=1, description="The tensors it reads.")]
    outputs: Annotated[list[StepTensor], Meta(min_length=1, description="The tensors it returns.")]
    sha256: (
        Annotated[
            str,
            Meta(
                description="Hex SHA-256 of the module's file: checked before its code runs, a mismatch refuses the "
                "load (the step is code: whoever can change the file runs it in the function)."
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        module, _, attr = self.function.partition(":")
        if not module or not attr or not all(p.isidentifier() for p in (*module.split("."), attr)):
            raise ValueError(f"function must be module:function, got {self.function!r}")
        if self.sha256 is not None:
            msgspec.structs.force_setattr(self, "sha256", sha256_hex(self.sha256))


Step = (
    TokenizeStep | ImageStep | SoftmaxStep | SigmoidStep | TopKStep | MeanPoolStep | PoolStep | CustomStep
)  # told apart by `step`


class EmbeddingSettings(Entry, frozen=True, kw_only=True):
    """How OpenAI's embeddings API (``POST /v1/embeddings``) serves a pipeline that embeds text."""

    output: (
        Annotated[
            str,
            Meta(
                description="The output holding one embedding a text (FP32 [-1, dim]); default: the pipeline's "
                "mean_pool output, or its only output."
            ),
        ]
        | None
    ) = None
    dimensions: Annotated[
        list[int],
        Meta(
            description="Shorter lengths the model was trained to be cut to (Matryoshka) that a request's `dimensions` "
            "may ask for (cut, then re-normalised); none: its full length only."
        ),
    ] = []

    def __post_init__(self) -> None:
        if any(d < 1 for d in self.dimensions):
            raise ValueError("dimensions must be positive lengths")
        msgspec.structs.force_setattr(self, "dimensions", sorted(set(self.dimensions)))


class PipelineSettings(Entry, frozen=True, kw_only=True):
    """Steps around a model, served under a name of their own: raw inputs in, finished outputs out."""

    name: Annotated[str, Meta(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")]
    model: Annotated[str, Meta(description="The model the steps surround.")]
    version: Annotated[str, Meta(description="Its version (default: latest).")] | None = None
    description: Annotated[str, Meta(description="Free text shown in metadata.")] = ""
    pre: Annotated[list[Step], Meta(description="Steps from the request's inputs to the model's.")] = []
    post: Annotated[list[Step], Meta(description="Steps from the model's outputs to the answer's.")] = []
    outputs: (
        Annotated[
            list[str],
            Meta(
                description="The outputs the pipeline answers with; default: every post step's, and the model's that "
                "no post step reads."
            ),
        ]
        | None
    ) = None
    cache_ttl_seconds: (
        Annotated[int, Meta(ge=1, description="Cache answers by the raw inputs for this long; off when unset.")] | None
    ) = None
    embedding: (
        Annotated[
            EmbeddingSettings,
            Meta(
                description="Served by OpenAI's embeddings API too. A pipeline whose first step is tokenize and whose "
                "last is mean_pool or pool is, without this table; the table names another output, or the "
                "Matryoshka lengths."
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        check_name(self.name, "name")
        check_name(self.model, "name")
        if not self.pre and not self.post:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        if self.embedding is not None:
            if not isinstance(self.pre[0] if self.pre else None, TokenizeStep):
                raise ValueError(f"pipeline {self.name!r}: an embedding pipeline's first step must be tokenize")
            ends_pooled = bool(self.post) and isinstance(self.post[-1], MeanPoolStep | PoolStep)
            one_output = self.outputs is not None and len(self.outputs) == 1
            if self.embedding.output is None and not ends_pooled and not one_output:
                raise ValueError(f"pipeline {self.name!r}: name the embedding's output (embedding.output)")


class CascadeSettings(Entry, frozen=True, kw_only=True):
    """A cascade in the manifest: served as a model of its own name."""

    name: Annotated[str, Meta(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")]
    fast: Annotated[str, Meta(description="The fast model (or pipeline), which answers at once.")]
    fast_version: Annotated[str, Meta(description="Its version (default: latest).")] | None = None
    slow: Annotated[str, Meta(description="The slow, accurate model (or pipeline), run as a follow-up.")]
    slow_version: Annotated[str, Meta(description="Its version (default: latest).")] | None = None
    output: Annotated[str, Meta(description="The fast model's output the confidence rule reads ([rows, classes]).")]
    scores: Annotated[
        Literal["probabilities", "logits"], Meta(description="What the output holds; logits go through a softmax.")
    ] = "probabilities"
    rule: Annotated[
        Literal["top1", "margin"],
        Meta(description="top1: top-class probability >= threshold; margin: top1 - top2 >= threshold."),
    ] = "top1"
    threshold: Annotated[
        float, Meta(ge=0.0, le=1.0, description="Confident at or above this; tune with `fnserve cascade tune`.")
    ]
    queue_url: (
        Annotated[str, Meta(description="Follow-up queue; default: FNSERVE_FOLLOWUP_QUEUE_URL of the server settings.")]
        | None
    ) = None
    result_ttl_seconds: Annotated[int, Meta(ge=60, description="How long follow-up results are kept.")] = 86_400

    def __post_init__(self) -> None:
        for name in (self.name, self.fast, self.slow):
            check_name(name, "name")
        if self.fast == self.slow and self.fast_version == self.slow_version:
            raise ValueError(f"cascade {self.name!r}: fast and slow are the same model")


class WorkerGroup(Entry, frozen=True, kw_only=True):
    """Models that ``fnserve serve`` runs in worker processes of their own, as Triton's instance groups and
    MLServer's per-model workers do: each of the group's workers holds its models and no other, so memory grows
    with what each group holds, not with workers x models. Models in no group run in the front process."""

    name: Annotated[str, Meta(min_length=1, description="The group's name (in metadata, metrics and logs).")]
    workers: Annotated[int, Meta(ge=1, le=64, description="Its worker processes, each holding all its models.")] = 1
    models: Annotated[list[str], Meta(min_length=1, description="The models (every version of each) its workers hold.")]


class Manifest(Entry, frozen=True, kw_only=True):
    """The model manifest: every model version this deployment serves, its pipelines and its cascades."""

    models: Annotated[list[ModelSettings], Meta(min_length=1, description="Served model versions.")]
    pipelines: Annotated[list[PipelineSettings], Meta(description="Steps around models.")] = []
    cascades: Annotated[list[CascadeSettings], Meta(description="Fast-then-accurate model pairs.")] = []
    groups: Annotated[
        list[WorkerGroup], Meta(description="Which models run in which worker processes of `fnserve serve`.")
    ] = []
    base_dir: Annotated[Path, Meta(description="Directory relative model paths are resolved against.")] = Path(".")

    def __post_init__(self) -> None:
        seen: set[tuple[str, str]] = set()
        for model in self.models:
            key = (model.name, model.version)
            if key in seen:
                raise ValueError(f"model {model.name!r} version {model.version!r} is listed twice")
            seen.add(key)
        models = {m.name for m in self.models}
        taken = set(models)
        for pipeline in self.pipelines:
            if pipeline.name in taken:
                raise ValueError(f"pipeline {pipeline.name!r}: the name is already a model's or a pipeline's")
            if pipeline.model not in models:
                raise ValueError(f"pipeline {pipeline.name!r}: its model {pipeline.model!r} is not in the manifest")
            if pipeline.version is not None and (pipeline.model, pipeline.version) not in seen:
                raise ValueError(
                    f"pipeline {pipeline.name!r}: model {pipeline.model!r} has no version {pipeline.version!r}"
                )
            taken.add(pipeline.name)
        served = set(taken)
        for cascade in self.cascades:
            if cascade.name in taken:
                raise ValueError(
                    f"cascade {cascade.name!r}: the name is already a model's, a pipeline's or a cascade's"
                )
            for role, member in (("fast", cascade.fast), ("slow", cascade.slow)):
                if member not in served:
                    raise ValueError(
                        f"cascade {cascade.name!r}: its {role} model {member!r} is not in the manifest "
                        "(as a model or a pipeline)"
                    )
            taken.add(cascade.name)
        placed: dict[str, str] = {}  # model -> its group
        named: set[str] = set()
        for group in self.groups:
            if group.name in named:
                raise ValueError(f"worker group {group.name!r} is listed twice")
            named.add(group.name)
            for name in group.models:
                if name not in models:
                    raise ValueError(f"worker group {group.name!r}: model {name!r} is not in the manifest")
                if name in placed:
                    raise ValueError(f"model {name!r} is in two worker groups: {placed[name]!r} and {group.name!r}")
                placed[name] = group.name

    def group_of(self, model: str) -> WorkerGroup | None:
        """The worker group that runs ``model`` (None: the front process does)."""
        return next((group for group in self.groups if model in group.models), None)

    def holding(self, group: str) -> Manifest:
        """What a worker of ``group`` loads: the group's models alone (no pipelines, cascades or groups)."""
        found = next((g for g in self.groups if g.name == group), None)
        if found is None:
            raise ValueError(f"the manifest has no worker group {group!r}")
        kept = [m for m in self.models if m.name in found.models]
        return self.replace(models=kept, pipelines=[], cascades=[], groups=[])


def step_files(data: dict[str, Any]) -> Iterator[tuple[str, bool]]:
    """The files a manifest's pipeline steps name, as written (``data`` is the parsed file, before
    validation), each once, with whether it must exist beside the manifest: tokenizers and label files
    must; a custom step's module (``module:function`` -> ``module.py``) may be installed instead."""
    seen: set[str] = set()
    for pipeline in data.get("pipelines", []):
        for step in (*pipeline.get("pre", []), *pipeline.get("post", [])):
            named = [(step.get("tokenizer"), True), (step.get("labels"), True)]
            if isinstance(step.get("function"), str):
                named.append((step["function"].partition(":")[0].replace(".", "/") + ".py", False))
            for path, required in named:
                if isinstance(path, str) and path not in seen:
                    seen.add(path)
                    yield path, required


def load_manifest(path: str | Path) -> Manifest:
    """Parse and validate a manifest file; relative model paths resolve against its directory.

    Every problem is a :class:`ConfigError` naming the file and the offending field.
    """
    path = Path(path)
    if path.suffix == ".onnx":
        raise ConfigError(_not_a_manifest(path))
    try:
        text = path.read_text(encoding="utf-8")
        # TOML is the format people write; JSON (a TOML-shaped document) is what fnserve writes itself.
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"manifest {path} does not exist") from None
    except UnicodeDecodeError:  # binary: a model, most likely, where a manifest was expected
        raise ConfigError(_not_a_manifest(path)) from None
    except (OSError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"manifest {path} cannot be read: {exc}") from exc
    data.setdefault("base_dir", str(path.resolve().parent))
    try:
        return Manifest.validate(data)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"manifest {path} is invalid: {_describe(exc, data)}") from None


def _not_a_manifest(path: Path) -> str:
    return (
        f"{path} is not a manifest (TOML) but a binary file, a model perhaps: fnserve serves the models a "
        f"manifest lists. Write one with `fnserve manifest add {path} --name NAME --manifest manifest.toml`, "
        "then serve manifest.toml"
    )


def refused_at(exc: Exception) -> tuple[list[str | int], str]:
    """Where msgspec's error is (``$.models[0].max_batch_size`` as ``["models", 0, "max_batch_size"]``; empty: the
    whole value, as a ``__post_init__`` check says) and what it says."""
    message, _, at = str(exc).partition(" - at `$")
    return [int(index) if index else field for field, index in re.findall(r"\.(\w+)|\[(\d+)\]", at)], message


def _describe(exc: msgspec.ValidationError, data: dict[str, Any]) -> str:
    """The error by where it is: a model, pipeline or cascade entry by its name (and position), then the field."""
    loc, message = refused_at(exc)
    where = ".".join(map(str, loc)) or "manifest"
    section, index = loc[:2] if len(loc) >= 2 else ("", None)
    entries = data.get(str(section))
    if isinstance(index, int) and isinstance(entries, list) and index < len(entries):
        name = entries[index].get("name") if isinstance(entries[index], dict) else None
        if isinstance(name, str):
            kind = {"models": "model", "pipelines": "pipeline", "cascades": "cascade"}.get(str(section), str(section))
            rest = ".".join(map(str, loc[2:]))
            where = f"{kind} {name!r} ({section}.{index})" + (f" {rest}" if rest else "")
    return f"{where}: {message}"
