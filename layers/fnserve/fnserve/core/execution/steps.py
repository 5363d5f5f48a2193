"""Steps: what turns text or images into tensors before a model, and its outputs into answers after it.

Every step is a callable over named arrays: it reads some tensors (``reads``, with the specs a
client sees for those that are the pipeline's own inputs) and returns new ones (``writes``).
Rows are independent: a step maps ``n`` rows in to ``n`` rows out, so a pipeline can run any
slice of a batch through it. A problem with the input is an :class:`InvalidInput` naming the
row; anything else a step raises is a bug of the step.

Built in: ``tokenize`` (Hugging Face ``tokenizers``: texts, prompts, text pairs), ``image`` (Pillow), ``softmax``,
``sigmoid``, ``topk``, ``pool`` (and ``mean_pool``); ``custom`` calls a function of the user's. The third-party
libraries are imported when a pipeline that needs them is built, not before (cold start).
"""

from __future__ import annotations

import binascii
import hashlib
import importlib
import importlib.util
import io
import logging
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fnserve.core.errors import ConfigError, FnserveError, InferenceError, InvalidInput
from fnserve.core.execution.embeddings import TOKENS, TRUNCATED, TokenIds
from fnserve.core.models.datatypes import V2_TO_NUMPY, Arrays
from fnserve.core.models.manifest.steps import (
    CustomStep,
    ImageStep,
    MeanPoolStep,
    PoolStep,
    SigmoidStep,
    SoftmaxStep,
    StepTensor,
    TokenizeStep,
    TopKStep,
)
from fnserve.core.models.manifest.steps import Step as StepSettings
from fnserve.core.models.registry import LoadedModel, TensorSpec

logger = logging.getLogger(__name__)

BYTES = V2_TO_NUMPY["BYTES"]


def spec(name: str, datatype: str, shape: Sequence[int]) -> TensorSpec:
    """A tensor spec from its V2 datatype name."""
    return TensorSpec(name, datatype, V2_TO_NUMPY[datatype], tuple(shape))


class Step:
    """One step: ``reads`` names the tensors it takes, ``writes`` describes those it returns."""

    name: str
    reads: tuple[TensorSpec, ...]
    writes: tuple[TensorSpec, ...]
    digest: str = ""  # what, beyond its settings, decides its results (a file's hash): part of cache keys

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        raise NotImplementedError

    def sort_key(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any] | None:
        """A first step may say how to order rows so that chunks pad little (None: keep the order)."""
        return None


def build_step(settings: StepSettings, model: LoadedModel, base_dir: Path) -> Step:
    """The step a manifest entry describes, around ``model`` (whose tensors some steps adapt to)."""
    if isinstance(settings, TokenizeStep):
        return Tokenize(settings, model, base_dir)
    if isinstance(settings, ImageStep):
        return DecodeImage(settings)
    if isinstance(settings, SoftmaxStep):
        return Softmax(settings)
    if isinstance(settings, SigmoidStep):
        return Sigmoid(settings)
    if isinstance(settings, TopKStep):
        return TopK(settings, base_dir)
    if isinstance(settings, MeanPoolStep | PoolStep):
        return Pool(settings, model)
    return Custom(settings, base_dir)


def _file(base_dir: Path, path: str, what: str) -> Path:
    resolved = Path(path) if Path(path).is_absolute() else base_dir / path
    if not resolved.is_file():
        raise ConfigError(f"{what} {resolved} does not exist")
    return resolved


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _texts(name: str, array: np.ndarray[Any, Any]) -> list[Any]:
    """One string a row: str elements as they are, bytes as UTF-8, token ids (:class:`TokenIds`) kept as they
    are; refuse what is not text."""
    texts: list[Any] = []
    for i, value in enumerate(array.ravel().tolist()):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidInput(
                    f"input {name!r} row {i}: text must be UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
        elif type(value) is TokenIds:
            texts.append(value)
            continue
        elif not isinstance(value, str):
            raise InvalidInput(f"input {name!r} row {i}: text must be a string, got {type(value).__name__}")
        if not value.strip():
            raise InvalidInput(f"input {name!r} row {i}: text is empty")
        texts.append(value)
    return texts


# -- text ------------------------------------------------------------------------------------------


class Tokenize(Step):
    """Texts -> token ids, attention mask and token type ids (those of them the model takes).

    A text gets the default prompt put before it unless a request named its own (:class:`Prompted`); with a ``pair``
    input each row is two texts tokenized as one sequence, the second cut first. Truncated to ``max_length`` tokens (or
    refused, where the manifest says so) and padded to the longest text of the call; an adaptive batcher in front of the
    model pads further, to the model's length buckets. A row may also be given as its token ids (:class:`TokenIds`),
    checked against the vocabulary and run as they are. Beside the model's inputs it writes the tokens each row ran and
    whether it was cut (:data:`TOKENS`, :data:`TRUNCATED`), which the model never sees. Its :meth:`sort_key` (a text's
    length) lets a pipeline put texts of like lengths in one chunk.
    """

    def __init__(self, settings: TokenizeStep, model: LoadedModel, base_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = _file(base_dir, settings.tokenizer, "tokenizer")
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type for a malformed file
            raise ConfigError(f"tokenizer {path} cannot be loaded: {exc}") from exc
        padding = self.tokenizer.padding  # the pad id, where the file configures padding
        pad_id = padding["pad_id"] if padding is not None else self.tokenizer.token_to_id("[PAD]")
        self.pad_id = pad_id if pad_id is not None else 0
        self.tokenizer.no_padding()  # padded here, to the longest or to a bucket, straight into arrays
        self.tokenizer.enable_truncation(settings.max_length)
        self.vocabulary = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.opening, self.closing = _special_ends(self.tokenizer)
        self.digest = _sha256(path)
        self.name = "tokenize"
        self.input = settings.input
        self.max_length = settings.max_length
        self.truncate = settings.truncate
        self.pair = settings.pair
        self.prompt = settings.prompts[settings.default_prompt] if settings.default_prompt is not None else ""
        taken = {s.name: s for s in model.inputs}
        wanted = (settings.ids, settings.attention_mask, settings.token_type_ids)
        self.outputs = [name for name in wanted if name in taken]
        if settings.ids not in taken:
            raise ConfigError(f"tokenize: model {model.name!r} has no input {settings.ids!r} for the token ids")
        self.ids, self.mask, self.types = wanted
        self.dtypes = {name: taken[name].dtype for name in self.outputs}
        self.reads = tuple(spec(name, "BYTES", [-1]) for name in (settings.input, settings.pair) if name is not None)
        self.writes = (
            *(spec(n, "INT64", [-1, -1]) for n in self.outputs),
            spec(TOKENS, "INT64", [-1]),
            spec(TRUNCATED, "BOOL", [-1]),
        )

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        rows = _texts(self.input, tensors[self.input])
        n = len(rows)
        sequences: list[tuple[Sequence[int], Sequence[int] | None]] = []
        truncated = np.zeros(n, dtype=np.bool_)
        if self.pair is not None:
            sequences = self._pairs(rows, _texts(self.pair, tensors[self.pair]), truncated)
        else:
            prompt = self.prompt
            texts = [row if type(row) is not str else prompt + row for row in rows if isinstance(row, str)]
            encodings = iter(self.tokenizer.encode_batch_fast(texts) if texts else ())
            for row, value in enumerate(rows):
                if isinstance(value, str):
                    encoding = next(encodings)
                    truncated[row] = bool(encoding.overflowing)
                    sequences.append((encoding.ids, encoding.type_ids))
                else:
                    sequences.append((self._given(row, value), None))
                    truncated[row] = len(value) > self.max_length
        if not self.truncate and truncated.any():
            row = int(np.argmax(truncated))
            raise InvalidInput(
                f"input {self.input!r} row {row}: the text is longer than the model's {self.max_length} tokens"
            )
        counts = np.fromiter((len(ids) for ids, _ in sequences), np.int64, n)
        length = int(counts.max()) if n else 1
        ids = np.full((n, length), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.int64)
        types = np.zeros((n, length), dtype=np.int64)
        for row, (row_ids, row_types) in enumerate(sequences):
            k = len(row_ids)
            ids[row, :k] = row_ids
            mask[row, :k] = 1
            if row_types is not None:
                types[row, :k] = row_types
        made = {self.ids: ids, self.mask: mask, self.types: types}
        out = {name: made[name].astype(self.dtypes[name], copy=False) for name in self.outputs}
        out[TOKENS] = counts
        out[TRUNCATED] = truncated
        return out

    def _pairs(
        self, firsts: list[Any], seconds: list[Any], truncated: np.ndarray[Any, Any]
    ) -> list[tuple[Sequence[int], Sequence[int] | None]]:
        """Each row's two texts as one sequence with its type ids (a cross-encoder's query and document): past
        ``max_length`` the second is cut first, and the first only where it is over half the length."""
        for name, texts in ((self.input, firsts), (self.pair, seconds)):
            given = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
            if given is not None:
                raise InvalidInput(f"input {name!r} row {given}: a text pair is tokenized from text, not token ids")
        if len(firsts) != len(seconds):
            raise InvalidInput(f"inputs {self.input!r} and {self.pair!r} must have as many rows")
        tokenizer = self.tokenizer
        room = self.max_length - tokenizer.num_special_tokens_to_add(True)
        first = tokenizer.encode_batch_fast(firsts, add_special_tokens=False) if firsts else []
        second = tokenizer.encode_batch_fast(seconds, add_special_tokens=False) if seconds else []
        sequences: list[tuple[Sequence[int], Sequence[int] | None]] = []
        for row, (a, b) in enumerate(zip(first, second, strict=True)):
            # Each side was cut to max_length already when encoded: overflowing says it was longer still.
            over = bool(a.overflowing or b.overflowing) or len(a) + len(b) > room
            if len(a) + len(b) > room:
                keep = min(len(a), max(room - len(b), room // 2))
                a.truncate(keep)
                b.truncate(room - keep)
            truncated[row] = over
            merged = tokenizer.post_process(a, b, add_special_tokens=True)
            sequences.append((merged.ids, merged.type_ids))
        return sequences

    def _given(self, row: int, ids: TokenIds) -> Sequence[int]:
        """A row's token ids, checked against the vocabulary, cut to ``max_length``."""
        if not ids:
            raise InvalidInput(f"input {self.input!r} row {row}: no token ids")
        top, bottom = max(ids), min(ids)
        if top >= self.vocabulary or bottom < 0:
            bad = top if top >= self.vocabulary else bottom
            raise InvalidInput(
                f"input {self.input!r} row {row}: token id {bad} is outside the vocabulary (0 to {self.vocabulary - 1})"
            )
        opening, closing = self.opening, self.closing
        if tuple(ids[: len(opening)]) != opening or (closing and tuple(ids[-len(closing) :]) != closing):
            # Another tokenizer's ids read as this one's are words of nonsense: LangChain's OpenAIEmbeddings sends
            # OpenAI's tiktoken ids unless told otherwise, and nothing else about them is wrong.
            ends = " and ".join(
                f"{where} with {' '.join(f'{self.tokenizer.id_to_token(i)} ({i})' for i in marks)}"
                for where, marks in (("start", opening), ("end", closing))
                if marks
            )
            raise InvalidInput(
                f"input {self.input!r} row {row}: token ids must be this model's own, as its tokenizer's "
                f"encode(text).ids gives them, which {ends}; LangChain's OpenAIEmbeddings sends OpenAI's tiktoken "
                "ids unless made with check_embedding_ctx_length=False"
            )
        if len(ids) <= self.max_length:
            return ids
        return (*ids[: self.max_length - len(closing)], *closing)  # cut as a text is: its closing token kept

    def sort_key(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        """Each row's text length (characters or bytes, both texts of a pair; token ids count as a word's length
        each): about its token count, without tokenizing."""
        key = _lengths(tensors[self.input])
        return key if self.pair is None else key + _lengths(tensors[self.pair])


def _lengths(texts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.fromiter(
        (len(v) if isinstance(v, str | bytes) else 4 * len(v) if type(v) is TokenIds else 0 for v in texts.ravel()),
        np.int64,
    )


def _special_ends(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids the tokenizer puts before and after every text (BERT's [CLS] and [SEP]); none where it adds none."""
    plain = tuple(tokenizer.encode("a", add_special_tokens=False).ids)
    marked = tuple(tokenizer.encode("a").ids)
    for start in range(len(marked) - len(plain) + 1):
        if marked[start : start + len(plain)] == plain:
            return marked[:start], marked[start + len(plain) :]
    return (), ()


class Pool(Step):
    """Token embeddings -> one a row, as sentence-transformers' Pooling module makes it (mean over the attention
    mask, the first token's, the largest of each dimension, or the last real token's), L2-normalised if asked."""

    def __init__(self, settings: MeanPoolStep | PoolStep, model: LoadedModel) -> None:
        self.name = settings.step
        self.mode = settings.mode if isinstance(settings, PoolStep) else "mean"
        self.input, self.mask, self.output, self.normalize = (
            settings.input,
            settings.mask,
            settings.output,
            settings.normalize,
        )
        self.reads = (spec(settings.input, "FP32", [-1, -1, -1]), spec(settings.mask, "INT64", [-1, -1]))
        made = next((o for o in model.outputs if o.name == settings.input), None)
        dim = made.shape[-1] if made is not None and len(made.shape) == 3 else -1
        self.writes = (spec(settings.output, "FP32", [-1, dim]),)

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        tokens, mask = tensors[self.input], tensors[self.mask]
        if tokens.ndim != 3 or mask.ndim != 2 or tokens.shape[0] != mask.shape[0]:
            raise InferenceError(
                f"{self.name}: {self.input!r} must be [rows, tokens, dim] and {self.mask!r} [rows, tokens], "
                f"got {list(tokens.shape)} and {list(mask.shape)}"
            )
        # A batcher may have padded the tokens further than this request's mask: the padding is masked anyway.
        tokens = tokens[:, : mask.shape[1]].astype(np.float32, copy=False)
        mask = mask[:, : tokens.shape[1]]
        if self.mode == "mean":
            weights = mask[:, :, None].astype(np.float32)
            pooled = np.einsum("rtd,rtx->rd", tokens, weights)
            pooled /= np.maximum(weights.sum(axis=1), 1e-9)
        elif self.mode == "cls":
            pooled = tokens[:, 0].copy()
        elif self.mode == "max":
            pooled = np.where(mask[:, :, None] > 0, tokens, np.float32(-1e9)).max(axis=1)
        else:  # padded on the right: a row's last real token is its mask's count less one
            last = np.maximum(mask.sum(axis=1) - 1, 0)
            pooled = tokens[np.arange(len(tokens)), last].copy()
        if self.normalize:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return {self.output: pooled}


# -- images ----------------------------------------------------------------------------------------


class DecodeImage(Step):
    """Encoded images -> one pixel tensor: decoded, converted, resized, cropped, scaled and laid out.

    JPEG, PNG and WebP only. An image over ``max_pixels`` is refused before it is decoded (its
    header says its size), so a small file that would decode to gigabytes costs nothing; Pillow's
    own guard (``Image.MAX_IMAGE_PIXELS``, 89 million pixels) stays in place behind it. In a
    JSON request, where there are no raw bytes, an image is a base64 string.
    """

    FORMATS = frozenset({"JPEG", "PNG", "WEBP"})
    # Modes Pillow converts to RGB and L faithfully; 16-bit and float images would be clipped.
    MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr"})

    def __init__(self, settings: ImageStep) -> None:
        from PIL import Image

        self.Image = Image
        self.settings = settings
        self.resample = Image.Resampling[settings.resample.upper()]
        self.name = "image"
        self.input = settings.input
        self.output = settings.output
        self.channels = 3 if settings.mode == "RGB" else 1
        self.mean = np.asarray(settings.mean, dtype=np.float32)
        self.std = np.asarray(settings.std, dtype=np.float32)
        datatype = "UINT8" if settings.dtype == "uint8" else "FP32"
        h, w = self._final_size()
        shape = {
            "NCHW": [-1, self.channels, h, w],
            "NHWC": [-1, h, w, self.channels],
            "flat": [-1, -1 if -1 in (h, w) else h * w * self.channels],
        }[settings.layout]
        self.reads = (spec(settings.input, "BYTES", [-1]),)
        self.writes = (spec(settings.output, datatype, shape),)

    def _final_size(self) -> tuple[int, int]:
        s = self.settings
        if s.crop is not None:
            return s.crop[0], s.crop[1]
        if isinstance(s.resize, list):
            return s.resize[0], s.resize[1]
        return -1, -1

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        images = [self._pixels(i, value) for i, value in enumerate(tensors[self.input].ravel().tolist())]
        if len({image.shape for image in images}) > 1:
            raise InvalidInput(
                f"input {self.input!r}: images of one request must come out the same size; set resize and crop "
                f"(got {sorted({image.shape[:2] for image in images})})"
            )
        s = self.settings
        batch = np.stack(images) if images else np.zeros((0, 1, 1, self.channels), dtype=np.uint8)
        if s.dtype == "float32":
            batch = (batch.astype(np.float32) * np.float32(s.scale) - self.mean) / self.std
        if s.layout == "NCHW":
            batch = np.ascontiguousarray(batch.transpose(0, 3, 1, 2))
        elif s.layout == "flat":
            batch = batch.reshape(len(images), -1)
        return {self.output: batch}

    def _pixels(self, row: int, value: Any) -> np.ndarray[Any, Any]:
        """One image as [height, width, channels] uint8; every problem of the image is a 422 naming its row."""
        Image = self.Image
        where = f"input {self.input!r} row {row}"
        data = _image_bytes(where, value)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=sorted(self.FORMATS))
                if image.width * image.height > self.settings.max_pixels:
                    raise InvalidInput(
                        f"{where}: the image is over the limit of {self.settings.max_pixels} pixels "
                        f"({image.width}x{image.height})"
                    )
                if image.mode not in self.MODES:
                    raise InvalidInput(f"{where}: image mode {image.mode} is not supported (8-bit images only)")
                image.draft(self.settings.mode, self._draft_size(image.size))  # JPEG: decode at a reduced scale
                image = image.convert(self.settings.mode)
                image = self._resized(image)
        except FnserveError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # over Pillow's own, higher limit
            raise InvalidInput(f"{where}: the image is over the limit of {self.settings.max_pixels} pixels") from None
        except Image.UnidentifiedImageError:
            raise InvalidInput(f"{where}: not a JPEG, PNG or WebP image Pillow can read") from None
        except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated or corrupt data
            raise InvalidInput(f"{where}: the image is corrupt or truncated ({exc})") from None
        pixels = np.asarray(image, dtype=np.uint8)
        return pixels[..., None] if pixels.ndim == 2 else pixels

    def _draft_size(self, size: tuple[int, int]) -> tuple[int, int] | None:
        s = self.settings
        if isinstance(s.resize, list):
            return s.resize[1], s.resize[0]
        if isinstance(s.resize, int):
            scale = s.resize / min(size)
            return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))
        return None

    def _resized(self, image: Any) -> Any:
        s = self.settings
        if isinstance(s.resize, list):
            image = image.resize((s.resize[1], s.resize[0]), self.resample)
        elif isinstance(s.resize, int):
            scale = s.resize / min(image.size)
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, self.resample)
        if s.crop is not None:
            height, width = s.crop
            if image.width < width or image.height < height:
                raise InvalidInput(f"the image is {image.width}x{image.height}, smaller than the crop {width}x{height}")
            left, top = (image.width - width) // 2, (image.height - height) // 2
            image = image.crop((left, top, left + width, top + height))
        return image


# How each accepted format starts; anything else is read as base64 (JSON carries no raw bytes).
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


def _image_bytes(where: str, value: Any) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    if not isinstance(data, bytes):
        raise InvalidInput(f"{where}: an image must be bytes, got {type(value).__name__}")
    if not data:
        raise InvalidInput(f"{where}: the image is empty")
    if data.startswith(_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP"):
        return data
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            f"{where}: not a JPEG, PNG or WebP image (raw bytes, with the binary tensor extension), "
            "nor one in base64 (in JSON)"
        ) from None


# -- scores ----------------------------------------------------------------------------------------


class _Activation(Step):
    """Logits -> scores of the same shape, in place or under another name."""

    def __init__(self, settings: SoftmaxStep | SigmoidStep) -> None:
        self.name = settings.step
        self.input = settings.input
        self.output = settings.output or settings.input
        self.reads = (spec(self.input, "FP32", [-1, -1]),)
        self.writes = (spec(self.output, "FP32", [-1, -1]),)


class Softmax(_Activation):
    """Logits -> probabilities along the last axis."""

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        logits = tensors[self.input].astype(np.float32, copy=False)
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return {self.output: shifted / shifted.sum(axis=-1, keepdims=True)}


class Sigmoid(_Activation):
    """Logits -> each one's probability on its own (a reranker's one logit, a multi-label classifier's)."""

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        logits = tensors[self.input].astype(np.float32, copy=False)
        return {self.output: np.exp(-np.logaddexp(np.float32(0), -logits))}  # 1 / (1 + e^-x), never overflowing


class TopK(Step):
    """Scores -> the ``k`` best classes of each row, best first: labels (BYTES) and scores (FP32)."""

    def __init__(self, settings: TopKStep, base_dir: Path) -> None:
        self.name = "topk"
        self.input, self.k = settings.input, settings.k
        self.labels_output, self.scores_output = settings.labels_output, settings.scores_output
        self.labels: np.ndarray[Any, Any] | None = None
        if settings.labels is not None:
            path = _file(base_dir, settings.labels, "labels file")
            names = path.read_text(encoding="utf-8").splitlines()
            self.labels = np.array([n.strip().encode() for n in names if n.strip()], dtype=object)
            self.digest = _sha256(path)
        self.reads = (spec(self.input, "FP32", [-1, -1]),)
        self.writes = (spec(self.labels_output, "BYTES", [-1, self.k]), spec(self.scores_output, "FP32", [-1, self.k]))

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        scores = tensors[self.input]
        if scores.ndim != 2 or scores.shape[1] < self.k:
            raise InferenceError(f"topk: {self.input!r} must be [rows, >= {self.k} classes], got {list(scores.shape)}")
        if self.labels is not None and len(self.labels) != scores.shape[1]:
            raise InferenceError(f"topk: the labels file has {len(self.labels)} labels, the model {scores.shape[1]}")
        top = np.argsort(-scores, axis=1, kind="stable")[:, : self.k]
        names = self.labels[top] if self.labels is not None else np.char.encode(top.astype(str)).astype(object)
        return {self.labels_output: names, self.scores_output: np.take_along_axis(scores, top, axis=1)}


# -- the user's own --------------------------------------------------------------------------------


def _checked_import(name: str, sha256: str) -> ModuleType:
    """The module ``name`` run from the bytes whose SHA-256 was checked (never read twice: no file swapped between
    the check and the run)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or spec.loader is None or not spec.origin.endswith(".py"):
        raise ConfigError(f"cannot find the source of {name!r} to check its sha256")
    code = Path(spec.origin).read_bytes()
    digest = hashlib.sha256(code).hexdigest()
    if digest != sha256:
        raise ConfigError(f"{spec.origin} has sha256 {digest}, not the manifest's {sha256}: refused")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(code, spec.origin, "exec"), module.__dict__)  # noqa: S102 - the checked module, as import runs it
    except BaseException:
        del sys.modules[name]
        raise
    return module


class Custom(Step):
    """A function of the user's: ``fn(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]``.

    It gets the tensors its manifest entry names as ``inputs`` (BYTES elements as ``bytes``)
    and must return every tensor named as ``outputs``, with as many rows as it was given. To
    refuse an input it raises :class:`fnserve.core.errors.InvalidInput` with a message for the
    client (a 422); anything else it raises is a 500, logged with its traceback.
    """

    def __init__(self, settings: CustomStep, base_dir: Path) -> None:
        module_name, _, attr = settings.function.partition(":")
        if str(base_dir) not in sys.path:
            sys.path.insert(0, str(base_dir))  # the user's module may ship beside the manifest
        try:
            module = (
                _checked_import(module_name, settings.sha256)
                if settings.sha256
                else importlib.import_module(module_name)
            )
        except ConfigError as exc:
            raise ConfigError(f"custom step {settings.function}: {exc.message}") from None
        except Exception as exc:
            raise ConfigError(f"custom step {settings.function}: cannot import {module_name!r}: {exc}") from exc
        function = getattr(module, attr, None)
        if not callable(function):
            raise ConfigError(f"custom step {settings.function}: {module_name!r} has no function {attr!r}")
        self.function: Callable[[Arrays], Mapping[str, Any]] = function
        self.name = settings.function
        self.reads = tuple(_declared(t, settings.function) for t in settings.inputs)
        self.writes = tuple(_declared(t, settings.function) for t in settings.outputs)
        source = getattr(module, "__file__", None)
        self.digest = _sha256(Path(source)) if source else ""

    def __call__(self, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        rows = len(next(iter(tensors.values()))) if tensors else 0
        given = {t.name: tensors[t.name] for t in self.reads}
        returned = self.function(given)
        if not isinstance(returned, Mapping):
            raise InferenceError(f"custom step {self.name} returned {type(returned).__name__}, not a dict of arrays")
        out: Arrays = {}
        for declared in self.writes:
            if declared.name not in returned:
                raise InferenceError(f"custom step {self.name} did not return {declared.name!r}")
            array = np.asarray(returned[declared.name])
            if array.ndim == 0 or array.shape[0] != rows:
                raise InferenceError(
                    f"custom step {self.name}: {declared.name!r} has shape {list(array.shape)}, not {rows} rows"
                )
            if declared.datatype != "BYTES" and array.dtype != declared.dtype:
                array = array.astype(declared.dtype)
            out[declared.name] = array
        return out


def _declared(tensor: StepTensor, function: str) -> TensorSpec:
    if tensor.datatype not in V2_TO_NUMPY:
        raise ConfigError(f"custom step {function}: {tensor.name!r} has unknown datatype {tensor.datatype!r}")
    return spec(tensor.name, tensor.datatype, tensor.shape)


def run_step(step: Step, tensors: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
    """A step's tensors; its refusals (4xx) pass through, anything else is a logged 500 naming the step."""
    try:
        return step(tensors)
    except FnserveError:
        raise
    except Exception as exc:
        logger.exception("step %s failed", step.name)
        raise InferenceError(f"step {step.name} failed: {type(exc).__name__}") from exc
