"""The runner: one road from a batch that a gatherer closed to each of its items' answers.

Whatever gathered them (the adaptive batcher, the requests of one turn of the event loop, a job delivery, a request
of many texts cut into runs), a batch's items are validated and looked up in the cache already; the runner stacks
them (:mod:`fnserve.core.execution.stacking`), makes one call of the model for the stack, splits the outputs back by
each item's rows and finishes each item (what its answer becomes: a pipeline's post steps, its encoding). It
isolates a failure one way: a call that fails for more than one item is run again in halves, down to the item that
causes it, which gets the error alone; an item whose own finish fails gets that error alone, the call having gone
well. A model that is not loaded fails every half alike, so its batch is not split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fnserve.core.codec.rows import check_rows, take_rows
from fnserve.core.errors import FnserveError, InferenceError, ModelNotReady
from fnserve.core.execution.servable import Ran
from fnserve.core.execution.stacking import Failed, Finish, Stacked, Stacking, answers
from fnserve.core.models.datatypes import Arrays

Call = Callable[[Arrays, int], Ran]  # one call of the model for a stack and its rows: its outputs, and their device


class Item(Stacked, Protocol):
    """An item as the runner stacks and finishes it."""

    @property
    def finish(self) -> Finish | None: ...  # None: its outputs are its answer


@dataclass(slots=True)
class Rows:
    """A request's validated rows as an item whose answer is its outputs."""

    inputs: Arrays
    rows: int
    length: int = 0
    finish: Finish | None = None


def _ignored(*_: object) -> None:
    pass


class Runner:
    """Runs closed batches; ``on_split`` is told each failed call halved to find its culprit, ``on_run`` each call
    of :meth:`run` with its items' rows (a batch bucket's padding not counted)."""

    def __init__(
        self,
        stacking: Stacking | None = None,
        on_split: Callable[[], None] = _ignored,
        on_run: Callable[[int], None] = _ignored,
    ) -> None:
        self.stacking = stacking or Stacking()
        self.on_split = on_split
        self.on_run = on_run
        self.splits = 0  # failed calls halved, for tests and metrics

    def run(self, items: Sequence[Item], call: Call, bucket: int = 0, *, split: bool = True) -> list[Any]:
        """Each item's answer (what its finish made of its outputs and the device that ran them), or a :class:`Failed`
        with its own error: the items stacked (variable-length inputs padded to ``bucket``'s length), ``call`` once,
        the outputs split back.
        ``split`` false: one item, whose outputs are its own whatever their rows (a model that reduces over the
        batch)."""

        def attempt(start: int, stop: int) -> list[Any]:
            part = items[start:stop]
            stacked, rows = self.stacking.stack(part, bucket)
            self.on_run(sum(item.rows for item in part))
            outputs, device = call(stacked, sum(rows))
            return answers(outputs, rows, [item.finish for item in part], device, split=split)

        return self._isolated(0, len(items), attempt) if items else []

    def run_columns(
        self,
        feed: Arrays,
        rows: Sequence[int],
        call: Call,
        finish: Callable[[Arrays, Sequence[int]], list[Any]],
        what: str,
    ) -> list[Any]:
        """:meth:`run` for items stacked already, one after another along the batch axis (a job delivery's, parsed
        into columns): item ``j`` owns ``rows[j]`` rows; ``finish`` makes the answers of a run's items from its
        outputs and their rows, in one pass over the run."""

        def attempt(start: int, stop: int) -> list[Any]:
            whole = start == 0 and stop == len(rows)
            counts = rows if whole else rows[start:stop]
            outputs, _ = call(feed if whole else take_rows(feed, rows, range(start, stop)), sum(counts))
            check_rows(outputs, counts, what)
            return finish(outputs, counts)

        return self._isolated(0, len(rows), attempt) if rows else []

    def _isolated(self, start: int, stop: int, attempt: Callable[[int, int], list[Any]]) -> list[Any]:
        """The answers of items ``start`` to ``stop`` from ``attempt(start, stop)``, one call of them; a failed call
        of more than one halved and each half attempted again, until each error lands on the item that causes it."""
        try:
            return attempt(start, stop)
        except Exception as exc:  # noqa: BLE001 - whatever a call raises is its items' error, never the process's
            error = as_error(exc)
            if stop - start == 1 or isinstance(error, ModelNotReady):
                return [Failed(error)] * (stop - start)
        self.splits += 1
        self.on_split()
        middle = start + (stop - start) // 2
        return self._isolated(start, middle, attempt) + self._isolated(middle, stop, attempt)

    def run_rows(
        self, feeds: Mapping[int, tuple[Arrays, int]], call: Call, stackable: bool
    ) -> dict[int, Ran | FnserveError]:
        """Separate requests' validated feeds (by index: the feed and its rows), each one's outputs (and their device)
        or its own error: those of one row shape stacked into one call (none stacked unless ``stackable``)."""
        groups: dict[Any, list[int]] = {}
        for i, (feed, _) in feeds.items():
            groups.setdefault(self.stacking.key(feed, 0) if stackable else i, []).append(i)
        results: dict[int, Ran | FnserveError] = {}
        for group in groups.values():
            items = [Rows(feeds[i][0], feeds[i][1], finish=Ran) for i in group]
            for i, outcome in zip(group, self.run(items, call, split=stackable), strict=True):
                results[i] = as_error(outcome.error) if isinstance(outcome, Failed) else outcome
        return results


def as_error(exc: Exception) -> FnserveError:
    """What a batch's run raised, as the error its items get: ours as it is, anything else the server's (500)."""
    return exc if isinstance(exc, FnserveError) else InferenceError(f"batched inference failed: {exc}")
