"""The steps a pipeline runs around its model, each a table told apart by its ``step``."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from fnserve.core.models.manifest.entries import Entry, sha256_hex


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
