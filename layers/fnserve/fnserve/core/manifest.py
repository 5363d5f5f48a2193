"""The manifest format: every model version a deployment serves, its tensor overrides, its pipelines
(steps around a model) and its cascades.

A leaf: it knows pydantic and nothing of the features that read it. TOML is what people
write; JSON (a TOML-shaped document) is what fnserve writes itself (an s3:// manifest fetched).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fnserve.core.errors import ConfigError
from fnserve.core.names import check_name

ModelName = Annotated[str, Field(min_length=1, max_length=128)]


class TensorOverride(BaseModel):
    """What the manifest may say about one input or output beyond what the ONNX graph says."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: list[int] | None = Field(
        default=None,
        description="Shape to advertise and enforce (-1 for a variable dimension); must have the "
        "graph's rank and agree with its fixed dimensions.",
    )


class CudaProvider(BaseModel):
    """ONNX Runtime's CUDA execution provider, with its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["CUDAExecutionProvider"]
    device_id: int = Field(default=0, ge=0, description="The GPU this model runs on.")
    memory_limit_mb: int | None = Field(
        default=None, ge=1, description="Most GPU memory the session's arena may take; none: no limit."
    )
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field(
        default="EXHAUSTIVE",
        description="How cuDNN picks convolution algorithms: EXHAUSTIVE measures each (once per shape, at "
        "warm-up), HEURISTIC guesses.",
    )
    copy_streams: bool = Field(
        default=True, description="Copies to and from the GPU on their own streams, overlapping compute."
    )
    cuda_graph: bool = Field(
        default=False,
        description="Capture one CUDA graph per batch shape (batch_buckets x length_buckets) and replay it: far "
        "less launch overhead at small batches, and no cost at a change of shape. Every node must run on CUDA.",
    )


class TensorrtProvider(BaseModel):
    """ONNX Runtime's TensorRT execution provider, with its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["TensorrtExecutionProvider"]
    device_id: int = Field(default=0, ge=0, description="The GPU this model runs on.")
    fp16: bool = Field(default=False, description="Let TensorRT run layers in FP16.")
    int8: bool = Field(
        default=False,
        description="Let TensorRT run layers in INT8: for a model with symmetric QuantizeLinear/DequantizeLinear "
        "nodes, whose scales TensorRT reads. A dynamically quantized model has none: use fp16 for it.",
    )
    cache_dir: str | None = Field(
        default=None,
        description="Where built engines and the timing cache are kept, so later starts skip the build: a writable "
        "folder, made and checked at start, shared by the workers and kept across restarts.",
    )
    max_workspace_mb: int | None = Field(default=None, ge=1, description="TensorRT's workspace limit.")
    min_shapes: dict[str, list[int]] = Field(default_factory=dict, description="Shape profile: smallest shapes.")
    opt_shapes: dict[str, list[int]] = Field(default_factory=dict, description="Shape profile: shapes tuned for.")
    max_shapes: dict[str, list[int]] = Field(default_factory=dict, description="Shape profile: largest shapes.")

    @model_validator(mode="after")
    def _profile(self) -> TensorrtProvider:
        profiles = (self.min_shapes, self.opt_shapes, self.max_shapes)
        if any(profiles) and not all(p.keys() == self.min_shapes.keys() for p in profiles):
            raise ValueError("min_shapes, opt_shapes and max_shapes must name the same inputs")
        for name in self.min_shapes:
            low, opt, high = (p[name] for p in profiles)
            if not len(low) == len(opt) == len(high) or any(
                not 1 <= a <= b <= c for a, b, c in zip(low, opt, high, strict=True)
            ):
                raise ValueError(f"input {name!r}: the shape profile must have min <= opt <= max, all positive")
        return self


Provider = Annotated[CudaProvider | TensorrtProvider, Field(discriminator="name")] | str


class ModelSettings(BaseModel):
    """One model version in the manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ModelName = Field(description="Model name used in URLs and job records.")
    version: str = Field(default="1", description="Version label; the highest is the default.")
    path: str = Field(description="ONNX file: a path relative to the manifest, an absolute path, or s3://bucket/key.")
    sha256: str = Field(description="Hex SHA-256 of the ONNX file; a mismatch refuses the load.")
    description: str = Field(default="", description="Free text shown in model metadata.")
    inputs: dict[str, TensorOverride] = Field(
        default_factory=dict, description="Per-input overrides, keyed by the graph's input name."
    )
    outputs: dict[str, TensorOverride] = Field(
        default_factory=dict, description="Per-output overrides, keyed by the graph's output name."
    )
    max_batch_size: int = Field(
        default=1024,
        ge=1,
        description="Largest batch sent to the runtime in one call; bigger requests are chunked.",
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="ONNX Runtime intra-op threads; default: available CPUs / worker processes.",
    )
    inter_op_threads: int = Field(default=1, ge=1, description="ONNX Runtime inter-op threads.")
    execution_providers: list[Provider] = Field(
        default_factory=lambda: list[Provider](["CPUExecutionProvider"]),
        min_length=1,
        description="ONNX Runtime execution providers in order of preference: a name, or a table with the name "
        "and its options (CUDAExecutionProvider, TensorrtExecutionProvider).",
    )
    cpu_fallback: bool = Field(
        default=False,
        description="Run on the CPU, with a warning, when a GPU provider asked for cannot be created; "
        "otherwise that stops the start.",
    )
    graph_optimization: Literal["disable", "basic", "extended", "all"] = Field(
        default="all", description="ONNX Runtime graph optimisation level."
    )
    max_batch_time_ms: float | None = Field(
        default=None,
        gt=0,
        description="Adaptive batching in long-running servers: gather concurrent requests for at most this long "
        "after the first one (and at most max_batch_size rows), and only while more are on their way (as many as "
        "were in flight lately): a lone request runs at once; off when unset.",
    )
    stack_requests: bool = Field(
        default=True,
        description="Whether separate requests to this model may run stacked in one call (when every input and "
        "output is batch-first): an SQS batch's jobs, and in long-running servers the requests that arrive together "
        "(decoded in one turn of the event loop; nothing waits for more). Set false for a graph whose rows are not "
        "independent, where one row's outputs depend on the others'.",
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=9,
        description="Between models served by the same processes, higher first: in `fnserve serve`, its calls go "
        "before the queued calls of lower priority models for the same workers, and its batches run in the front "
        "process on threads the OS favours over theirs (a lower priority's threads are niced 5 per level below "
        "the highest).",
    )
    max_queue_size: int | None = Field(
        default=None,
        ge=1,
        description="Adaptive batching: a bound on the rows that wait for a batch, beside max_queue_delay_ms; a "
        "request that would go past it is refused at once (503 with Retry-After, gRPC UNAVAILABLE). Unset: none, "
        "the wait bounds the queue. A bound near max_batch_size refuses some requests of more clients than a batch "
        "whenever the batch running is not full, though they would be answered in time.",
    )
    max_queue_delay_ms: float | None = Field(
        default=None,
        gt=0,
        description="Adaptive batching: the longest a request waits for its batch. One whose rows ahead would take "
        "longer, at the pace of the latest runs, is refused as it arrives, before its body is read, and so is one "
        "foreseen to be answered past its client's own deadline (a gRPC deadline, Triton's timeout parameter); one "
        "still waiting this long after it arrived is refused then (503 with Retry-After, gRPC UNAVAILABLE), never "
        "run. Unset: 1000, or for a model slower than that, twice a full batch's run at the latest pace (a queue of "
        "one batch always fits). Clients that each wait for their answer before sending again are not refused "
        "while their requests wait less than this, however many they are; under overload the answered ones wait "
        "up to it.",
    )
    length_buckets: list[int] = Field(
        default_factory=list,
        description="Sequence lengths that batched variable-length inputs are padded up to (sorted, positive).",
    )
    batch_buckets: list[int] = Field(
        default_factory=list,
        description="Batch sizes that adaptive batches are padded up to (sorted, positive): a GPU then sees a few "
        "shapes, each warmed at start (cuDNN's algorithm search, TensorRT's engine).",
    )
    pad_inputs: list[str] = Field(default_factory=list, description="Inputs padded along axis 1 to their bucket.")
    max_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Adaptive batching of variable-length inputs (pad_inputs): a batch holds at most this many "
        "padded tokens (its longest request's length, or that length's bucket, times its rows). Requests of every "
        "length then wait in one queue: a batch takes the oldest, then those nearest its length. Unset: a queue a "
        "length bucket, a batch cut by max_batch_size alone.",
    )
    pad_value: float = Field(default=0.0, description="Value the padding is filled with.")
    cache_ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Cache this model's results for this long (in-process and DynamoDB); off when unset.",
    )
    session_per_shape: bool = Field(
        default=False,
        description="One ONNX Runtime session per batch shape (batch_buckets x length_buckets), so a change of "
        "shape never rebuilds a session's plans (CNNs on the CUDA provider pay ~200 ms at each); weights are held "
        "once per session.",
    )
    warmup: bool = Field(
        default=True,
        description="Run one zero-filled batch at load, so the first request does not pay the "
        "runtime's first-run allocations.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value, "model name")

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        return check_name(value, "model version")

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str) -> str:
        value = value.lower()
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise ValueError("sha256 must be 64 hex digits")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if value.startswith("s3://"):
            bucket, _, key = value[5:].partition("/")
            if not bucket or not key:
                raise ValueError(f"s3 path {value!r} must be s3://bucket/key")
        elif not value:
            raise ValueError("path must not be empty")
        return value

    @property
    def cuda_graphs(self) -> bool:
        """Whether its CUDA provider asks for one CUDA graph per batch shape."""
        return any(isinstance(p, CudaProvider) and p.cuda_graph for p in self.execution_providers)

    @model_validator(mode="after")
    def _batching(self) -> ModelSettings:
        if any(b < 1 for b in self.length_buckets) or self.length_buckets != sorted(set(self.length_buckets)):
            raise ValueError(f"length_buckets must be positive and ascending, got {self.length_buckets}")
        if self.pad_inputs and not self.length_buckets:
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
        if (self.length_buckets or self.pad_inputs or self.batch_buckets) and self.max_batch_time_ms is None:
            raise ValueError(
                "length_buckets, batch_buckets and pad_inputs only apply with max_batch_time_ms (adaptive batching)"
            )
        if self.max_batch_tokens is not None and not self.pad_inputs:
            raise ValueError("max_batch_tokens needs pad_inputs: the variable-length inputs whose tokens it counts")
        if not self.stack_requests and self.max_batch_time_ms is not None:
            raise ValueError("max_batch_time_ms (adaptive batching) stacks requests: it needs stack_requests")
        queueing = {"max_queue_size", "max_queue_delay_ms"} & self.model_fields_set
        if queueing and self.max_batch_time_ms is None:
            raise ValueError(f"{' and '.join(sorted(queueing))} only apply with max_batch_time_ms (adaptive batching)")
        return self

    @model_validator(mode="after")
    def _overrides(self) -> ModelSettings:
        for kind, overrides in (("input", self.inputs), ("output", self.outputs)):
            for tensor, override in overrides.items():
                if override.shape is not None and any(d < -1 or d == 0 for d in override.shape):
                    raise ValueError(
                        f"{kind} {tensor!r}: shape dimensions must be positive or -1, got {override.shape}"
                    )
        return self


class StepTensor(BaseModel):
    """A tensor a custom step reads or writes, as V2 metadata shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Tensor name.")
    datatype: str = Field(description="V2 datatype: FP32, INT64, BYTES, ...")
    shape: list[int] = Field(min_length=1, description="Shape, -1 where it varies; axis 0 is the batch.")


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenizeStep(_Step):
    """Text (BYTES, one string a row) -> the token tensors the model's graph takes, with `tokenizers`."""

    step: Literal["tokenize"]
    input: str = Field(default="text", description="The pipeline input holding the text: BYTES [-1].")
    tokenizer: str = Field(description="A tokenizer.json (Hugging Face tokenizers), relative to the manifest.")
    max_length: int = Field(default=512, ge=2, description="Longer texts are truncated to this many tokens.")
    truncate: bool = Field(
        default=True,
        description="Cut a text longer than max_length to its first tokens, as sentence-transformers does; false: "
        "refuse it (a 4xx naming the row).",
    )
    ids: str = Field(default="input_ids", description="The model input that takes the token ids.")
    attention_mask: str = Field(default="attention_mask", description="The model input that takes the mask.")
    token_type_ids: str = Field(default="token_type_ids", description="The model input that takes the type ids.")


class ImageStep(_Step):
    """Encoded images (JPEG, PNG or WebP bytes, one a row) -> one pixel tensor, with Pillow."""

    step: Literal["image"]
    input: str = Field(default="image", description="The pipeline input holding the images: BYTES [-1].")
    output: str = Field(description="The model input that takes the pixels.")
    mode: Literal["RGB", "L"] = Field(default="RGB", description="RGB (3 channels) or L (grayscale).")
    resize: list[int] | int | None = Field(
        default=None, description="[height, width], or the shorter side's length (aspect kept); none: as is."
    )
    crop: list[int] | None = Field(default=None, description="[height, width] cut from the centre after resizing.")
    resample: Literal["nearest", "box", "bilinear", "bicubic", "lanczos"] = Field(
        default="bilinear",
        description="Pillow's resampling filter (box: the mean of each block, exact on whole ratios).",
    )
    dtype: Literal["uint8", "float32"] = Field(default="float32", description="Pixel type the model takes.")
    scale: float = Field(default=1.0 / 255.0, description="float32: pixels (0-255) are multiplied by this first...")
    mean: list[float] = Field(default_factory=lambda: [0.0], description="...then this is subtracted (per channel)...")
    std: list[float] = Field(default_factory=lambda: [1.0], description="...and the result divided by this.")
    layout: Literal["NCHW", "NHWC", "flat"] = Field(
        default="NCHW", description="NCHW, NHWC, or flat: [N, H*W*C] (a classic model's feature vector)."
    )
    max_pixels: int = Field(
        default=40_000_000, ge=1, description="Larger images are refused (a decompression bomb guard)."
    )

    @model_validator(mode="after")
    def _sizes(self) -> ImageStep:
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
        return self


class SoftmaxStep(_Step):
    """Logits -> probabilities along the last axis."""

    step: Literal["softmax"]
    input: str = Field(description="The tensor holding the logits.")
    output: str | None = Field(default=None, description="Where the probabilities go (default: in place).")


class TopKStep(_Step):
    """Scores -> the k best classes per row: their labels (BYTES) and their scores (FP32)."""

    step: Literal["topk"]
    input: str = Field(description="The tensor holding the scores: [rows, classes].")
    k: int = Field(default=5, ge=1, description="How many classes per row.")
    labels: str | None = Field(
        default=None,
        description="A text file, one label a line in class order (relative to the manifest); "
        "none: the class indexes as text.",
    )
    labels_output: str = Field(default="labels", description="Output name of the labels: BYTES [rows, k].")
    scores_output: str = Field(default="scores", description="Output name of the scores: FP32 [rows, k].")


class MeanPoolStep(_Step):
    """Token embeddings -> one embedding per row: the mean over the attention mask, L2-normalised."""

    step: Literal["mean_pool"]
    input: str = Field(default="token_embeddings", description="The tensor of token embeddings: [rows, tokens, dim].")
    mask: str = Field(default="attention_mask", description="The mask the tokenize step made: [rows, tokens].")
    output: str = Field(default="embedding", description="Output name: FP32 [rows, dim].")
    normalize: bool = Field(default=True, description="Scale each embedding to unit length.")


class CustomStep(_Step):
    """A Python function of the user's: a dict of arrays in (the tensors it reads), a dict of arrays out."""

    step: Literal["custom"]
    function: str = Field(description="module:function; the module is looked up beside the manifest first.")
    inputs: list[StepTensor] = Field(min_length=1, description="The tensors it reads.")
    outputs: list[StepTensor] = Field(min_length=1, description="The tensors it returns.")

    @field_validator("function")
    @classmethod
    def _function(cls, value: str) -> str:
        module, _, attr = value.partition(":")
        if not module or not attr or not all(p.isidentifier() for p in (*module.split("."), attr)):
            raise ValueError(f"function must be module:function, got {value!r}")
        return value


Step = Annotated[
    TokenizeStep | ImageStep | SoftmaxStep | TopKStep | MeanPoolStep | CustomStep, Field(discriminator="step")
]


class EmbeddingSettings(BaseModel):
    """How OpenAI's embeddings API (``POST /v1/embeddings``) serves a pipeline that embeds text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output: str | None = Field(
        default=None,
        description="The output holding one embedding a text (FP32 [-1, dim]); default: the pipeline's "
        "mean_pool output, or its only output.",
    )
    dimensions: list[int] = Field(
        default_factory=list,
        description="Shorter lengths the model was trained to be cut to (Matryoshka) that a request's `dimensions` "
        "may ask for (cut, then re-normalised); none: its full length only.",
    )

    @field_validator("dimensions")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(d < 1 for d in value):
            raise ValueError("dimensions must be positive lengths")
        return sorted(set(value))


class PipelineSettings(BaseModel):
    """Steps around a model, served under a name of their own: raw inputs in, finished outputs out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")
    model: str = Field(description="The model the steps surround.")
    version: str | None = Field(default=None, description="Its version (default: latest).")
    description: str = Field(default="", description="Free text shown in metadata.")
    pre: list[Step] = Field(default_factory=list, description="Steps from the request's inputs to the model's.")
    post: list[Step] = Field(default_factory=list, description="Steps from the model's outputs to the answer's.")
    outputs: list[str] | None = Field(
        default=None,
        description="The outputs the pipeline answers with; default: every post step's, and the model's that "
        "no post step reads.",
    )
    cache_ttl_seconds: int | None = Field(
        default=None, ge=1, description="Cache answers by the raw inputs for this long; off when unset."
    )
    embedding: EmbeddingSettings | None = Field(
        default=None,
        description="Served by OpenAI's embeddings API too. A pipeline whose first step is tokenize and whose "
        "last is mean_pool is, without this table; the table names another output, or the Matryoshka lengths.",
    )

    @field_validator("name", "model")
    @classmethod
    def _names(cls, value: str) -> str:
        return check_name(value, "name")

    @model_validator(mode="after")
    def _steps(self) -> PipelineSettings:
        if not self.pre and not self.post:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        if self.embedding is not None:
            if not isinstance(self.pre[0] if self.pre else None, TokenizeStep):
                raise ValueError(f"pipeline {self.name!r}: an embedding pipeline's first step must be tokenize")
            ends_pooled = bool(self.post) and isinstance(self.post[-1], MeanPoolStep)
            one_output = self.outputs is not None and len(self.outputs) == 1
            if self.embedding.output is None and not ends_pooled and not one_output:
                raise ValueError(f"pipeline {self.name!r}: name the embedding's output (embedding.output)")
        return self


class CascadeSettings(BaseModel):
    """A cascade in the manifest: served as a model of its own name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Name clients call, like a model's: POST /v2/models/{name}/infer.")
    fast: str = Field(description="The fast model (or pipeline), which answers at once.")
    fast_version: str | None = Field(default=None, description="Its version (default: latest).")
    slow: str = Field(description="The slow, accurate model (or pipeline), run as a follow-up.")
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


class WorkerGroup(BaseModel):
    """Models that ``fnserve serve`` runs in worker processes of their own, as Triton's instance groups and
    MLServer's per-model workers do: each of the group's workers holds its models and no other, so memory grows
    with what each group holds, not with workers x models. Models in no group run in the front process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The group's name (in metadata, metrics and logs).")
    workers: int = Field(default=1, ge=1, le=64, description="Its worker processes, each holding all its models.")
    models: list[str] = Field(min_length=1, description="The models (every version of each) its workers hold.")


class Manifest(BaseModel):
    """The model manifest: every model version this deployment serves, its pipelines and its cascades."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[ModelSettings] = Field(min_length=1, description="Served model versions.")
    pipelines: list[PipelineSettings] = Field(default_factory=list, description="Steps around models.")
    cascades: list[CascadeSettings] = Field(default_factory=list, description="Fast-then-accurate model pairs.")
    groups: list[WorkerGroup] = Field(
        default_factory=list, description="Which models run in which worker processes of `fnserve serve`."
    )
    base_dir: Path = Field(default=Path("."), description="Directory relative model paths are resolved against.")

    @model_validator(mode="after")
    def _unique(self) -> Manifest:
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
        return self

    def group_of(self, model: str) -> WorkerGroup | None:
        """The worker group that runs ``model`` (None: the front process does)."""
        return next((group for group in self.groups if model in group.models), None)

    def holding(self, group: str) -> Manifest:
        """What a worker of ``group`` loads: the group's models alone (no pipelines, cascades or groups)."""
        found = next((g for g in self.groups if g.name == group), None)
        if found is None:
            raise ValueError(f"the manifest has no worker group {group!r}")
        kept = [m for m in self.models if m.name in found.models]
        return self.model_copy(update={"models": kept, "pipelines": [], "cascades": [], "groups": []})


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
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"manifest {path} is invalid: {_describe(exc, data)}") from None


def _not_a_manifest(path: Path) -> str:
    return (
        f"{path} is not a manifest (TOML) but a binary file, a model perhaps: fnserve serves the models a "
        f"manifest lists. Write one with `fnserve manifest add {path} --name NAME --manifest manifest.toml`, "
        "then serve manifest.toml"
    )


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    """Each error by where it is: a model or cascade entry by its name (and position), then the field."""
    parts = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        where = ".".join(loc) or "manifest"
        section, index = error["loc"][:2] if len(error["loc"]) >= 2 else ("", None)
        entries = data.get(str(section))
        if isinstance(index, int) and isinstance(entries, list) and index < len(entries):
            name = entries[index].get("name") if isinstance(entries[index], dict) else None
            if isinstance(name, str):
                kind = {"models": "model", "pipelines": "pipeline", "cascades": "cascade"}.get(
                    str(section), str(section)
                )
                where = f"{kind} {name!r} ({section}.{index})" + (f" {'.'.join(loc[2:])}" if loc[2:] else "")
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
