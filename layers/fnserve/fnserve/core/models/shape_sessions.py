"""Sessions that keep one compiled form per input shape, for models whose batcher pads to a few fixed shapes.

On the CUDA provider a CNN pays for every change of input shape: ONNX Runtime rebuilds its cuDNN
plans, whatever ``cudnn_conv_algo_search`` says, however well the shapes were warmed, and that
rebuild costs many runs of the model (docs/design/gpu-shapes.md). Two remedies, each over the shapes
the batcher can form (``batch_buckets`` x ``length_buckets``):

- :class:`ShapeSessions` (``session_per_shape = true``): one ONNX Runtime session per shape, each
  keeping its own plans, so a change costs nothing. The weights are held once per session.
- :class:`GraphSession` (the CUDA provider's ``cuda_graph = true``): one session with CUDA graph
  capture, one graph captured per shape and replayed through IO binding on device buffers that never
  move, which also saves the launches of a ``run()``. ONNX Runtime captures
  only graphs whose every node runs on CUDA; it refuses the others when the session is created.

A shape outside the set (a free dimension the batcher does not pad, say) still runs, on the first
session, or in the graph session without capture.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

ShapeKey = tuple[tuple[int, ...], ...]

# ONNX Runtime's run option naming the CUDA graph a run captures or replays; -1: neither.
GRAPH_ID = "gpu_graph_id"


def shape_key(feed: Mapping[str, Any], inputs: Sequence[str]) -> ShapeKey:
    """The shapes of a feed's tensors, in the model's input order."""
    return tuple(tuple(feed[name].shape) for name in inputs)


class ShapeSessions:
    """One ONNX Runtime session per input shape; a call runs on the session made for its shape."""

    def __init__(self, sessions: Mapping[ShapeKey, Any], first: Any) -> None:
        self._sessions = dict(sessions)
        self._first = first
        self._inputs = [i.name for i in first.get_inputs()]

    def __len__(self) -> int:
        return len(self._sessions)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[Any]:
        session = self._sessions.get(shape_key(input_feed, self._inputs), self._first)
        result: list[Any] = session.run(output_names, input_feed)
        return result

    def __getattr__(self, name: str) -> Any:
        # get_providers, get_provider_options, get_inputs, get_outputs: every session has the same.
        return getattr(self._first, name)


@dataclass(slots=True)
class _Graph:
    inputs: dict[str, ort.OrtValue]
    outputs: dict[str, ort.OrtValue]
    binding: Any  # ort.IOBinding
    options: ort.RunOptions


class GraphSession:
    """A session created with CUDA graph capture: one graph per shape of ``shapes``, replayed on fixed buffers.

    A call of a known shape copies its inputs into that graph's device buffers, replays the graph, and
    copies the outputs back; calls are serialised, since the buffers are shared. A call of another shape
    runs without capture. ``device`` is where the buffers live: ``cuda`` on a GPU, ``cpu`` where the
    same code path is tested without one (ONNX Runtime's CPU provider ignores the graph ids).
    """

    def __init__(self, session: Any, shapes: Collection[ShapeKey], device: str = "cuda", device_id: int = 0) -> None:
        self._session = session
        self._shapes = frozenset(shapes)
        self._device, self._device_id = device, device_id
        self._inputs = [i.name for i in session.get_inputs()]
        self._outputs = [o.name for o in session.get_outputs()]
        self._graphs: dict[ShapeKey, _Graph] = {}
        self._lock = threading.Lock()
        self._uncaptured = ort.RunOptions()
        self._uncaptured.add_run_config_entry(GRAPH_ID, "-1")

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[Any]:
        key = shape_key(input_feed, self._inputs)
        if key not in self._shapes:
            result: list[Any] = self._session.run(output_names, input_feed, self._uncaptured)
            return result
        with self._lock:
            graph = self._graphs.get(key)
            if graph is None:
                graph = self._graphs[key] = self._capture(input_feed)
            else:
                for name in self._inputs:
                    graph.inputs[name].update_inplace(np.ascontiguousarray(input_feed[name]))
                self._session.run_with_iobinding(graph.binding, graph.options)
            # A GPU buffer's numpy() is a copy; a CPU one's is a view of the buffer the next call overwrites.
            outputs = [graph.outputs[n].numpy() for n in (output_names or self._outputs)]
            return [o.copy() for o in outputs] if self._device == "cpu" else outputs

    def _capture(self, feed: Mapping[str, Any]) -> _Graph:
        """Buffers for this shape, bound, and its graph captured (ONNX Runtime runs once, then captures)."""
        shapes = self._session.run(self._outputs, feed, self._uncaptured)
        # A copy: on the CPU the buffer would be the caller's own array, overwritten by the next call.
        inputs = {
            name: ort.OrtValue.ortvalue_from_numpy(np.array(feed[name], order="C"), self._device, self._device_id)
            for name in self._inputs
        }
        outputs = {
            name: ort.OrtValue.ortvalue_from_shape_and_type(list(out.shape), out.dtype, self._device, self._device_id)
            for name, out in zip(self._outputs, shapes, strict=True)
        }
        binding = self._session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in outputs.items():
            binding.bind_ortvalue_output(name, value)
        options = ort.RunOptions()
        options.add_run_config_entry(GRAPH_ID, str(len(self._graphs) + 1))
        for _ in range(2):
            self._session.run_with_iobinding(binding, options)
        return _Graph(inputs, outputs, binding, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)
