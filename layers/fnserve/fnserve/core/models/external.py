"""External data: the files beside an ONNX graph that hold its tensors (a graph over protobuf's 2 GB must keep
them so, and many exporters do it for smaller ones), as a manifest entry's ``external_data`` names them.

The registry reads and checks each file as it does the graph, then gives onnxruntime the checked bytes, never the
paths, so what runs is what was checked. ``fnserve manifest add`` finds a graph's files with the onnx package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fnserve.core.errors import ConfigError
from fnserve.core.models.manifest.entries import data_file_name

if TYPE_CHECKING:
    import onnxruntime as ort

# How onnxruntime names a file the graph refers to that the table it was given lacks.
_UNLISTED = re.compile(r"External file: (.+?) not found from the table")


def beside(model: str, name: str) -> str:
    """Where the data file ``name`` of the model file ``model`` (a URI, or an object key) is: in the same folder."""
    folder = model.rpartition("/")[0]
    return f"{folder}/{name}" if folder else name


def hand_over(options: ort.SessionOptions, files: Mapping[str, bytes]) -> None:
    """Give onnxruntime the data files' checked bytes, by the names the graph uses (it copies what it needs while
    the session is made: they can go once it is). With no file, a table all the same: given one, onnxruntime refuses
    a file the table lacks instead of reading it, unchecked, from the working directory."""
    names, buffers = (list(files), list(files.values())) if files else ([""], [b""])
    options.add_external_initializers_from_files_in_memory(names, buffers, [len(b) for b in buffers])


def unlisted(exc: Exception) -> str | None:
    """The data file named in onnxruntime's refusal ``exc`` of a graph whose file it was not given, or None."""
    found = _UNLISTED.search(str(exc))
    return found[1] if found else None


def graph_files(model: Path) -> list[str]:
    """The data files ``model``'s graph keeps tensors in, by the names it gives them, each once (most graphs: none).

    The onnx package reads them from the graph; without it, a graph that loads from its own bytes has none, and one
    that does not is refused with what to install.
    """
    try:
        from onnx import load
        from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data
    except ImportError:
        if _self_contained(model):
            return []
        from fnserve.core.extras import install_hint

        raise ConfigError(
            f"{model} keeps tensors in files beside it, which only the onnx package can list: "
            f"{install_hint('quantize')}"
        ) from None
    graph = load(str(model), load_external_data=False)
    names = (ExternalDataInfo(t).location for t in _get_all_tensors(graph) if uses_external_data(t))
    try:
        return list(dict.fromkeys(data_file_name(name) for name in names))
    except ValueError as exc:
        raise ConfigError(f"{model}: {exc}") from None


def _self_contained(model: Path) -> bool:
    """Whether onnxruntime makes a session of ``model``'s bytes alone, with no data file."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    hand_over(options, {})
    try:
        ort.InferenceSession(model.read_bytes(), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        if unlisted(exc) is None:
            raise ConfigError(f"{model} cannot be loaded from its bytes: {exc}") from None
        return False
    return True
