"""A served name's configuration as Triton's model-configuration extension gives it (its ``config.pbtxt`` as JSON).

Triton's tools read it before anything else: perf_analyzer and model_analyzer take the inputs,
their datatypes and shapes, and whether the model batches from it. fnserve has no
``config.pbtxt``; this is built from the manifest and the graph:

- ``max_batch_size``: the manifest's, for a model whose every input and output is batch-first;
  then, as Triton's convention goes, ``dims`` leave the batch dimension out. A model with a fixed
  first dimension says 0 and gives whole shapes.
- ``dynamic_batching`` where the manifest batches (``max_batch_time_ms``): the window as
  ``max_queue_delay_microseconds``, ``batch_buckets`` as preferred sizes, and the admission
  bounds (``max_queue_delay_ms``, ``max_queue_size`` or 0: none) as the default queue policy, which
  rejects, and which a request's own shorter timeout overrides.
- ``instance_group``: where its sessions run (KIND_CPU or KIND_GPU) and how many run at once in
  this server (``instances``: one per front process running models itself, else one per inference
  worker of every front process).
- An input of one value per row (a pipeline's text) has ``dims: [1]`` and ``reshape: {shape: []}``,
  as Triton writes it: clients send ``[batch, 1]``, which validation takes as ``[batch]``.
- A pipeline is ``fnserve_pipeline`` with its own tensors (text or images in: TYPE_STRING), a
  cascade ``fnserve_cascade`` with its fast model's, each with its model's batching.
"""

from __future__ import annotations

from typing import Any

from fnserve.core.batching.admission import QUEUE_DELAY
from fnserve.core.execution.servable import Servable
from fnserve.core.models.manifest.models import ModelSettings
from fnserve.core.models.registry import TensorSpec


def triton_config(name: str, servable: Servable, platform: str, instances: int, versions: list[str]) -> dict[str, Any]:
    """The model configuration of ``name``, served by ``servable`` (a cascade: its fast model's)."""
    model = servable.model
    settings = model.settings
    batching = servable.batch_first and settings.max_batch_size > 0
    config: dict[str, Any] = {
        "name": name,
        "platform": platform,
        "backend": "onnxruntime" if platform == "onnxruntime_onnx" else "fnserve",
        "max_batch_size": settings.max_batch_size if batching else 0,
        "input": [_tensor(spec, batching, is_input=True) for spec in servable.inputs],
        "output": [_tensor(spec, batching, is_input=False) for spec in servable.outputs],
        "instance_group": [_instances(model.placement.device, model.placement.workers or instances)],
        "default_model_filename": "model.onnx",
    }
    if numeric := [int(v) for v in versions if v.isdigit()]:
        config["version_policy"] = {"specific": {"versions": numeric}}
    if batching and settings.max_batch_time_ms is not None:
        config["dynamic_batching"] = _dynamic_batching(settings)
    return config


def _tensor(spec: TensorSpec, batching: bool, *, is_input: bool) -> dict[str, Any]:
    dims = list(spec.shape[1:] if batching else spec.shape)
    tensor: dict[str, Any] = {"name": spec.name, "data_type": data_type(spec.datatype), "dims": dims}
    if is_input:
        if not dims:  # one value per row (a text): Triton's way to say so, which clients need a shape from
            tensor.update(dims=[1], reshape={"shape": []})
        tensor.update(format="FORMAT_NONE", is_shape_tensor=False, allow_ragged_batch=False, optional=False)
    else:
        tensor.update(label_filename="", is_shape_tensor=False)
    return tensor


def data_type(datatype: str) -> str:
    """Triton's DataType name of a V2 datatype (BYTES is TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _instances(device: str, instances: int) -> dict[str, Any]:
    if device.startswith("cuda"):
        index = device.partition(":")[2]
        gpus = [int(index)] if index.isdigit() else [0]
        return {"name": "gpu", "kind": "KIND_GPU", "count": instances, "gpus": gpus}
    return {"name": "cpu", "kind": "KIND_CPU", "count": instances}


def _dynamic_batching(settings: ModelSettings) -> dict[str, Any]:
    assert settings.max_batch_time_ms is not None
    policy: dict[str, Any] = {
        "timeout_action": "REJECT",
        # unset: the least it is (a slow model's is longer: AdaptiveBatcher.queue_delay)
        "default_timeout_microseconds": round(
            QUEUE_DELAY * 1e6 if settings.max_queue_delay_ms is None else settings.max_queue_delay_ms * 1000
        ),
        "allow_timeout_override": True,  # a request's own timeout bounds its wait where shorter
        "max_queue_size": settings.max_queue_size or 0,  # Triton's 0: no bound on the count
    }
    return {
        "preferred_batch_size": list(settings.batch_buckets),
        "max_queue_delay_microseconds": round(settings.max_batch_time_ms * 1000),
        "preserve_ordering": False,
        "default_queue_policy": policy,
    }
