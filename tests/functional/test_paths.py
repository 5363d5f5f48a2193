"""A request's whole way through fnserve, from each transport to onnxruntime's ``session.run`` and back.

``infra/docs/request_paths.py`` traces it (docs/architecture.md shows what it prints): each way's real entry,
warmed up, then one request recorded on every thread it touches. Every way must reach the model and answer as
onnxruntime does, through no more fnserve files, and no more crossings of ``core/``'s edge, than its bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import REPO, load_module

TOOL = load_module(REPO / "infra" / "docs" / "request_paths.py", "request_paths")

# Per way, the most distinct fnserve files and hops between core/ and the rest: above what each takes now by what
# the data plane's refactoring may move (a file or two, a callback more), so that a way that grows shows up here.
MOST = {
    "HTTP V2, batched model": (26, 15),
    "HTTP V2, unbatched model": (24, 15),
    "gRPC": (24, 20),
    "Lambda API event": (25, 14),
    "SQS batch": (22, 8),
}


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    """Each way's recorded request, traced in a fresh interpreter: a profile hook reaches only the threads started
    after it, and this process's model threads may have been started by earlier tests."""
    return {way.way: way for way in TOOL.traced_in_fresh_process()}


def test_every_way_is_traced(traced: dict[str, Any]) -> None:
    assert list(traced) == list(MOST)


@pytest.mark.parametrize("name", list(MOST))
def test_the_way_reaches_the_model_and_answers(traced: dict[str, Any], name: str) -> None:
    way = traced[name]
    assert way.runs, f"{name}: no onnxruntime run on the way: {' -> '.join(way.files)}"
    assert all(run.startswith("core/") for run in way.runs), way.runs  # the model runs in core, not in a transport
    assert way.answer  # the tool checked the answer against onnxruntime's own
    assert not way.files[0].startswith("core/"), way.files  # a transport takes the request first


@pytest.mark.parametrize("name", list(MOST))
def test_the_way_stays_short(traced: dict[str, Any], name: str) -> None:
    way = traced[name]
    files, hops = MOST[name]
    assert len(way.files) <= files, f"{name}: {len(way.files)} files, at most {files}: {' -> '.join(way.files)}"
    crossings = ", ".join(f"{pair} x{count}" for pair, count in way.hops.items())
    assert way.hop_count <= hops, f"{name}: {way.hop_count} hops, at most {hops}: {crossings}"
