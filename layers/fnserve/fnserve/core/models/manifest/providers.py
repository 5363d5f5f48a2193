"""The execution providers a model's entry may ask for, as tables with their options (what
:mod:`fnserve.core.models.providers` builds the sessions' providers from)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from fnserve.core.models.manifest.entries import Entry


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
