"""Per model and version statistics, as Triton's statistics extension reports them.

Two kinds of figures, counted where they happen:

- **Executions** (``inference_count``, ``execution_count``, ``batch_stats``): each run of a model,
  one ``session.run`` of a batch, whoever asked for it (a request alone, the adaptive batcher's
  batch, a pipeline's chunk, a cascade's model). :class:`Executions` lives on the loaded model
  version and counts in the process that sends the run, also when the session is in a pool worker.
- **Requests** (``inference_stats``: success, fail, queue, compute_input/infer/output, cache
  hit and miss; ``last_inference``): each inference request under the name it called, a model's,
  a pipeline's or a cascade's, counted by the data plane (:meth:`Statistics.served`,
  :meth:`Statistics.failed`). A pipeline or cascade also counts its successful requests that ran
  as executions of its own (it has no session), as Triton counts an ensemble's.

Stages map onto Triton's: ``compute_input`` is decoding the request (and a pipeline's pre
steps), ``compute_infer`` the inference (batched or not, and the wait for a worker),
``compute_output`` encoding the answer (and a pipeline's post steps), ``queue`` the wait for a
batch. A cache hit counts in ``success``, ``queue`` and ``cache_hit`` only, and in neither
``inference_count`` nor ``execution_count``.

Several front processes (``fnserve serve --processes``) each count their own; :class:`Statistics`
adds up the snapshots the others wrote (:meth:`Statistics.share`), as ``/metrics`` does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import orjson

# Request stages in Triton's order; each is [count, nanoseconds].
STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
Snapshot = dict[str, Any]  # one model version's figures in Triton's JSON form ($model_stat)
PENDING = 10_000  # requests kept as they came before they are added up


class Executions:
    """The runs of one loaded model version: rows and runs, and per batch size the runs and their time.
    Runs may come from several threads at once (batches in threads, offloaded requests)."""

    __slots__ = ("_lock", "batches", "last", "rows", "runs")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows = 0
        self.runs = 0
        self.last = 0  # milliseconds since the epoch
        self.batches: dict[int, list[int]] = {}  # batch size -> [runs, nanoseconds]

    def ran(self, rows: int, ns: int) -> None:
        with self._lock:
            self.rows += rows
            self.runs += 1
            self.last = time.time_ns() // 1_000_000
            batch = self.batches.get(rows)
            if batch is None:
                self.batches[rows] = [1, ns]
            else:
                batch[0] += 1
                batch[1] += ns


# A request as it came: name, version, ns from arrival to answer, stage timings (ms; None: refused), cache state,
# rows, and the epoch ns it was answered at.
_Record = tuple[str, str, int, Mapping[str, float] | None, str, int, int]
_Served = tuple[str, str, int, Mapping[str, float], str, int, int]


class _Requests:
    """The requests of one served name and version: [count, ns] per stage."""

    __slots__ = ("last", "rows", "runs", "stages")

    def __init__(self) -> None:
        self.stages = {stage: [0, 0] for stage in STAGES}
        self.last = 0
        self.rows = 0  # a pipeline's or cascade's own executions (a model's are its Executions)
        self.runs = 0


class Statistics:
    """The statistics of every name this process serves; ``entries``: (name, version) for each, with the
    :class:`Executions` of the model version that name runs itself (None for a pipeline or cascade)."""

    def __init__(self, entries: Iterable[tuple[str, str, Executions | None]]) -> None:
        self._entries = {(name, version): (executions, _Requests()) for name, version, executions in entries}
        self._versions: dict[str, list[str]] = {}
        for name, version in self._entries:
            self._versions.setdefault(name, []).append(version)
        self.peers: Callable[[], Iterable[Mapping[str, Snapshot]]] | None = None  # other processes' snapshots
        self._pending: list[_Record] = []  # requests as they came, added up when read or every PENDING

    def knows(self, name: str) -> bool:
        return name in self._versions

    def versions(self, name: str) -> list[str]:
        return self._versions.get(name, [])

    # -- counting (the data plane, on its event loop) -------------------------------------------

    def served(self, name: str, version: str, ns: int, timings: Mapping[str, float], cache: str, rows: int) -> None:
        """A successful request: ``ns`` from its arrival to its encoded answer, ``timings`` its stages (ms).

        Kept as it came (an append) and added up when the figures are read, or every :data:`PENDING`
        requests: adding up each request's eight stages as it comes costs many times the append."""
        pending = self._pending
        pending.append((name, version, ns, timings, cache, rows, time.time_ns()))
        if len(pending) >= PENDING:
            self._add_up()

    def failed(self, name: str, version: str, ns: int) -> None:
        """A refused request (bad input, a model failure, a full queue, a deadline)."""
        pending = self._pending
        pending.append((name, version, ns, None, "", 0, 0))
        if len(pending) >= PENDING:  # a flood of refusals with nobody reading: still bounded
            self._add_up()

    def _add_up(self) -> None:
        pending, self._pending = self._pending, []  # one event loop appends: nothing is lost between the two
        groups: dict[tuple[str, str], list[_Record]] = {}
        for record in pending:
            group = groups.get(record[:2])
            if group is None:
                groups[record[:2]] = [record]
            else:
                group.append(record)
        for key, records in groups.items():
            entry = self._entries.get(key)
            if entry is not None:
                self._add_records(entry, records)

    @staticmethod
    def _add_records(entry: tuple[Executions | None, _Requests], records: list[_Record]) -> None:
        """One name and version's records, each stage's figures added up over them all (each stage summed over
        a list of them all costs less than a record's stages added one at a time)."""
        executions, requests = entry
        stages = requests.stages
        served = cast(list[_Served], [r for r in records if r[3] is not None])
        if len(served) < len(records):
            _add_all(stages["fail"], [r[2] for r in records if r[3] is None])
        if not served:
            return
        requests.last = max(requests.last, max(r[6] for r in served) // 1_000_000)
        _add_all(stages["success"], [r[2] for r in served])
        _add_all(stages["queue"], [_ns(r[3].get("queue", 0.0)) for r in served])
        hits = [r for r in served if r[4] == "hit"]
        if hits:
            _add_all(stages["cache_hit"], [_ns(r[3].get("infer", 0.0)) for r in hits])
            served = [r for r in served if r[4] != "hit"]
            if not served:
                return
        stages["cache_miss"][0] += sum(1 for r in served if r[4] == "miss")  # its time is within compute_infer
        _add_all(stages["compute_input"], [_ns(r[3].get("decode", 0.0) + r[3].get("pre", 0.0)) for r in served])
        _add_all(stages["compute_infer"], [_ns(r[3].get("infer", 0.0)) for r in served])
        _add_all(stages["compute_output"], [_ns(r[3].get("encode", 0.0) + r[3].get("post", 0.0)) for r in served])
        if executions is None:
            requests.rows += sum(r[5] for r in served)
            requests.runs += len(served)

    # -- reporting -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Snapshot]:
        """This process's figures, keyed ``name/version``."""
        self._add_up()
        out = {}
        for (name, version), (executions, requests) in self._entries.items():
            stat: Snapshot = {"name": name, "version": version}
            stat["inference_stats"] = {stage: {"count": c, "ns": ns} for stage, (c, ns) in requests.stages.items()}
            if executions is not None:
                with executions._lock:  # noqa: SLF001 (a consistent copy)
                    rows, runs, last = executions.rows, executions.runs, executions.last
                    batches = {size: list(figures) for size, figures in executions.batches.items()}
            else:
                rows, runs, last, batches = requests.rows, requests.runs, 0, {}
            stat["last_inference"] = max(last, requests.last)
            stat["inference_count"] = rows
            stat["execution_count"] = runs
            stat["batch_stats"] = [_batch_stat(size, count, ns) for size, (count, ns) in sorted(batches.items())]
            out[f"{name}/{version}"] = stat
        return out

    def report(self, name: str | None = None, version: str | None = None) -> list[Snapshot]:
        """Triton's ``model_stats``: every name's versions, one name's, or one version's, summed over this
        process and its peers. The caller has checked that the name and version exist."""
        total = self.snapshot()
        for peer in self.peers() if self.peers is not None else ():
            for key, stat in peer.items():
                if key in total:
                    total[key] = _merge(total[key], stat)
        return [
            stat
            for stat in total.values()
            if (name is None or stat["name"] == name) and (version is None or stat["version"] == version)
        ]

    def share(self, directory: Path, me: str | None = None) -> Callable[[], None]:
        """Add up the snapshots other processes write to ``directory``; returns what writes this one's there
        (call it now and then: a reader sees figures as old as the last write). ``me``: this process's file
        name (its pid by default)."""
        mine = directory / f"stats-{me or os.getpid()}.json"

        def peers() -> list[Mapping[str, Snapshot]]:
            found = []
            for path in directory.glob("stats-*.json"):
                if path != mine:
                    try:
                        found.append(orjson.loads(path.read_bytes()))
                    except (OSError, orjson.JSONDecodeError):
                        continue  # being replaced, or its process's directory is going
            return found

        last_written = b""

        def write() -> None:
            nonlocal last_written
            data = orjson.dumps(self.snapshot())
            if data == last_written:
                return  # nothing happened since: an idle server writes nothing
            partial = mine.with_suffix(".tmp")
            partial.write_bytes(data)
            partial.replace(mine)  # readers see the old file or the new one, never half of one
            last_written = data

        self.peers = peers
        return write


def _add_all(figure: list[int], ns: list[int]) -> None:
    figure[0] += len(ns)
    figure[1] += sum(ns)


def _ns(ms: float) -> int:
    return int(ms * 1e6)


def _batch_stat(size: int, count: int, ns: int) -> Snapshot:
    # onnxruntime takes the inputs as they are and gives the outputs as arrays: no separate copy in or out
    # to time (a request's decoding and encoding are in its compute_input and compute_output).
    none = {"count": count, "ns": 0}
    return {
        "batch_size": size,
        "compute_input": none,
        "compute_infer": {"count": count, "ns": ns},
        "compute_output": none,
    }


def _merge(a: Snapshot, b: Mapping[str, Any]) -> Snapshot:
    """Two processes' figures of one model version, added up."""
    stages = {
        stage: {k: a["inference_stats"][stage][k] + b["inference_stats"][stage][k] for k in ("count", "ns")}
        for stage in STAGES
    }
    batches: dict[int, list[int]] = {}
    for stat in (*a["batch_stats"], *b["batch_stats"]):
        figures = batches.setdefault(stat["batch_size"], [0, 0])
        figures[0] += stat["compute_infer"]["count"]
        figures[1] += stat["compute_infer"]["ns"]
    return {
        "name": a["name"],
        "version": a["version"],
        "last_inference": max(a["last_inference"], b["last_inference"]),
        "inference_count": a["inference_count"] + b["inference_count"],
        "execution_count": a["execution_count"] + b["execution_count"],
        "inference_stats": stages,
        "batch_stats": [_batch_stat(size, count, ns) for size, (count, ns) in sorted(batches.items())],
    }
