"""Worker processes that run Lambda handlers like warm containers: one invocation at a time each.

Each worker is a spawned process (never forked) that imports the function's module once, so
its warm globals are built once, as in a Lambda container. One dispatcher thread waits on
every worker's pipe and process sentinel: it hands queued invocations to idle workers,
resolves their futures, and notices a dead worker at once, failing its invocation with a
503-class error and starting a replacement. A worker that outlives the function's timeout
is killed and replaced (a 504). A worker that cannot start (its module fails to import) is
started again on the next invocation, as Lambda retries a failed init, and the invocations
waiting for it get the init error; a pool given ``attempts`` (a server's) starts it again at
once instead, and gives up after that many in a row, for its owner to stop. Only plain data
crosses the process boundary: events and responses as plain values (dicts, lists, strings,
numbers, bytes, numpy arrays), errors as ``{type, message, status_code}``, in the typed
messages of :mod:`fnserve.workers.messages`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import multiprocessing
import os
import selectors
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from fnserve.core.errors import FnserveError, HandlerError, InvocationTimeout, WorkerDied
from fnserve.workers.messages import FromWorker, InitFailed, Invoke, Output, Ready, Returned, Started, Usage
from fnserve.workers.worker import worker_main

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FunctionSpec:
    """What a worker needs to become a warm container of one function (crosses processes as JSON)."""

    name: str
    code_dir: str
    handler: str = "app.handler"
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 3.0
    memory_mb: int = 128
    console: bool = False  # send its output and each invocation's usage to the pool's observer
    paths: list[str] = field(default_factory=list)  # import paths after code_dir (a Lambda function's layers)
    memory_limit: bool = False  # stop the worker, as Lambda stops a function, when it uses over memory_mb
    image: str = ""  # a container image function runs from this image (fnserve.emulator.images),
    command: list[str] = field(default_factory=list)  # with this command (ImageConfig.Command; empty: the image's)


class Pool(Protocol):
    """Warm workers of one function, as the emulator invokes them: this module's processes, or containers
    of an image function (:class:`fnserve.emulator.images.ImagePool`)."""

    @property
    def size(self) -> int: ...

    def invoke(self, event: Any) -> Future[Any]: ...

    def recycle(self) -> None: ...

    def close(self, grace: float = 5.0) -> None: ...

    def worker_pids(self) -> list[int]: ...

    def busy(self) -> int: ...


class Observer(Protocol):
    """Watches a pool's invocations (the emulator's console): called on the pool's dispatcher thread."""

    def started(self, spec: FunctionSpec, request_id: str) -> None: ...

    def output(self, spec: FunctionSpec, request_id: str | None, text: str) -> None: ...

    def finished(
        self, spec: FunctionSpec, request_id: str, event: Any, response: Any, error: str | None, usage: Usage | None
    ) -> None: ...


@dataclass(eq=False, slots=True)
class _Job:
    id: str
    event: Any
    future: Future[Any]
    priority: int = 0


class _Jobs:
    """Invocations waiting for a worker: the highest priority first, in arrival order within a priority."""

    def __init__(self) -> None:
        self._levels: dict[int, collections.deque[_Job]] = {}

    def __bool__(self) -> bool:
        return any(self._levels.values())

    def append(self, job: _Job) -> None:
        self._levels.setdefault(job.priority, collections.deque()).append(job)

    def appendleft(self, job: _Job) -> None:
        """``job`` first among its priority (it was taken already)."""
        self._levels.setdefault(job.priority, collections.deque()).appendleft(job)

    def popleft(self) -> _Job:
        for priority in sorted(self._levels, reverse=True):
            if self._levels[priority]:
                return self._levels[priority].popleft()
        raise IndexError("no invocation waits")


@dataclass(eq=False)  # one per process: compared by identity
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    job: _Job | None = None
    started: bool = False  # the worker acknowledged the job: it may have run
    deadline: float = float("inf")
    timed_out: bool = False
    broken: bool = False  # it exited before it was ready: started again on the next invocation
    retiring: bool = False  # replaced by a fresh worker once idle (the code changed: recycle())


class WorkerPool:
    """``workers`` warm containers of one function; :meth:`invoke` returns a future of the response.

    ``attempts``: once started, how many workers in a row may exit before they are ready (each started again at
    once) before the pool gives up: it starts no more, fails what no worker is left to run with the init error,
    and calls ``on_give_up`` with that error (on its dispatcher thread). None: as Lambda, a worker that cannot
    start is tried again at the next invocation, for ever.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        workers: int = 1,
        observer: Observer | None = None,
        attempts: int | None = None,
        on_give_up: Callable[[HandlerError], None] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        if attempts is not None and attempts < 1:
            raise ValueError("a pool that gives up needs at least one attempt")
        self.spec = spec
        self.observer = observer
        self.attempts = attempts
        self.on_give_up = on_give_up
        self.start_failures = 0  # workers in a row that exited before they were ready
        self.given_up: HandlerError | None = None  # the init error the pool gave up on (``attempts``)
        self._started = False  # start() returned: a worker that cannot start no longer fails the start
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._queue = _Jobs()
        self._lock = threading.Lock()
        # The dispatcher sleeps in one selector over every worker's pipe and sentinel, kept across
        # rounds; invoke() wakes it with a byte on a plain pipe.
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closing = False
        self._dispatcher = threading.Thread(target=self._dispatch, name=f"pool-{spec.name}", daemon=True)
        self.respawns = 0
        self.recycles = 0  # recycle() calls carried out
        self.failure: str | None = None  # the latest init error, if a worker could not start
        self._size = workers
        self._recycle = False  # asked by recycle(), carried out on the dispatcher thread
        self._retired: list[Any] = []  # processes of retired workers, told to exit and reaped by close()

    # -- public -----------------------------------------------------------------------------------

    def start(self, wait_ready: float = 120.0) -> WorkerPool:
        """Start the workers and wait until each has built its warm globals.

        Raises :class:`HandlerError` with the init error if a worker cannot start (the pool is
        closed then), and :class:`TimeoutError` if they are not ready in ``wait_ready`` seconds.
        """
        self._workers = [self._spawn() for _ in range(self._size)]
        self._dispatcher.start()
        deadline = time.monotonic() + wait_ready
        while not all(w.ready for w in self._workers):
            if any(w.broken for w in self._workers):
                self.close()
                raise HandlerError(f"function {self.spec.name} cannot start: {self.failure}")
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"function {self.spec.name}: workers not ready after {wait_ready}s")
            time.sleep(0.01)
        self._started = True
        return self

    def invoke(self, event: Any, priority: int = 0) -> Future[Any]:
        """Queue one invocation; the future gets the handler's response or a :class:`FnserveError`. While every
        worker is busy, invocations of a higher ``priority`` go before those queued of a lower one."""
        future: Future[Any] = Future()
        if self._closing:
            future.set_exception(WorkerDied(f"function {self.spec.name} is shutting down"))
            return future
        with self._lock:
            self._queue.append(_Job(uuid.uuid4().hex, event, future, priority))
        self._wake()
        return future

    def recycle(self) -> None:
        """Replace every worker with a fresh one (new code, a cold start), each once its running invocation,
        if any, has finished: nothing in flight is lost, and what is queued runs on the new workers."""
        self._recycle = True
        self._wake()

    def close(self, grace: float = 5.0) -> None:
        """Stop every worker (letting running invocations finish for ``grace`` seconds); no orphans."""
        if self._closing:
            return
        self._closing = True
        self._wake()
        self._dispatcher.join(timeout=grace + 5)
        for worker in self._workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        deadline = time.monotonic() + grace
        for process in [w.process for w in self._workers] + self._retired:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        with self._lock:
            while self._queue:
                self._queue.popleft().future.set_exception(WorkerDied(f"function {self.spec.name} shut down"))
        if not self._dispatcher.is_alive():
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    @property
    def size(self) -> int:
        """How many workers the pool keeps."""
        return self._size

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if not w.broken]

    def busy(self) -> int:
        """Workers running an invocation now."""
        return sum(1 for w in self._workers if w.job is not None and not w.broken)

    # -- dispatcher -------------------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # closed: the pool has shut down
            os.write(self._wake_w, b"\0")

    def _spawn(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=worker_main, args=(child, json.dumps(asdict(self.spec))), name=f"fnserve-{self.spec.name}"
        )
        process.start()
        child.close()
        worker = _Worker(process, parent)
        self._selector.register(parent.fileno(), selectors.EVENT_READ, (worker, "conn"))
        self._selector.register(process.sentinel, selectors.EVENT_READ, (worker, "sentinel"))
        return worker

    def _forget(self, worker: _Worker) -> None:
        """Stop watching a dead worker, and read what it said before it died (once: a worker that broke while
        starting is forgotten when it exits, and may be retired by a recycle after that)."""
        if worker.conn.closed:
            return
        self._drain(worker)
        for fd in (worker.conn.fileno(), worker.process.sentinel):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)
        worker.conn.close()

    def _dispatch(self) -> None:
        while not self._closing:
            nearest = min((w.deadline for w in self._workers), default=float("inf"))
            timeout = None if nearest == float("inf") else max(0.0, nearest - time.monotonic())
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                worker, what = key.data
                if worker.broken or worker not in self._workers:
                    continue  # replaced earlier in this round
                if what == "conn":
                    self._receive(worker)
                else:
                    self._replace(worker)
            self._expire()
            self._retire()
            self._assign()

    def _receive(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            return  # the sentinel will report the death
        self._handle(worker, message)

    def _drain(self, worker: _Worker) -> None:
        with contextlib.suppress(EOFError, OSError):
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv())

    def _handle(self, worker: _Worker, message: FromWorker) -> None:
        if isinstance(message, Ready):
            worker.ready = True
            self.start_failures = 0
        elif isinstance(message, InitFailed):  # the worker exits next
            self.failure = message.message
            logger.error("function %s: %s", self.spec.name, self.failure)
        elif isinstance(message, Output):
            if self.observer is not None:
                self.observer.output(self.spec, worker.job.id if worker.job is not None else None, message.text)
        elif worker.job is None or worker.job.id != message.id:
            return  # an answer to an invocation already answered (timed out): dropped
        elif isinstance(message, Started):
            worker.started = True
            if self.observer is not None:
                self.observer.started(self.spec, message.id)
        else:
            job = worker.job
            worker.job, worker.started, worker.deadline = None, False, float("inf")
            if isinstance(message, Returned):
                self._finished(job, message.response, None, message.usage)
                job.future.set_result(message.response)
            else:
                error = FnserveError.from_dict(message.error)
                self._finished(job, None, error.message, message.usage)
                job.future.set_exception(error)

    def _finished(self, job: _Job, response: Any, error: str | None, usage: Usage | None) -> None:
        if self.observer is not None:
            self.observer.finished(self.spec, job.id, job.event, response, error, usage)

    def _replace(self, worker: _Worker) -> None:
        worker.process.join(timeout=1)
        self._forget(worker)  # a result it sent just before dying still counts
        if not worker.ready:
            self._broken(worker)
            return
        if worker.job is not None and not worker.started and not worker.timed_out:
            # It died before taking the job (killed while idle): the job never ran, so run it elsewhere.
            with self._lock:
                self._queue.appendleft(worker.job)
        elif worker.job is not None:
            future = worker.job.future
            if worker.timed_out:
                error: FnserveError = InvocationTimeout(
                    f"function {self.spec.name} timed out after {self.spec.timeout:g}s; its worker was replaced"
                )
            else:
                error = WorkerDied(
                    f"function {self.spec.name}: its worker died (exit {worker.process.exitcode}) during the invocation"
                )
            self._finished(worker.job, None, error.message, None)
            future.set_exception(error)
        index = self._workers.index(worker)
        if self._closing:
            return
        logger.warning("function %s: worker %s exited; starting a new one", self.spec.name, worker.process.pid)
        self._workers[index] = self._spawn()
        self.respawns += 1

    def _broken(self, worker: _Worker) -> None:
        """A worker exited while starting: like a failed Lambda init, retried on the next invocation (at once,
        with ``attempts``, until that many in a row have failed)."""
        worker.broken = True
        self.start_failures += 1
        if self.failure is None:
            self.failure = f"its worker exited with code {worker.process.exitcode} while starting"
        error = HandlerError(f"function {self.spec.name} cannot start: {self.failure}")
        if self._started and self.attempts is not None and self.start_failures >= self.attempts:
            if self.given_up is None:
                self.given_up = HandlerError(f"{error.message} ({self.start_failures} times in a row)")
                logger.error("function %s: %s; giving up", self.spec.name, self.given_up.message)
                if self.on_give_up is not None:
                    self.on_give_up(self.given_up)
        if any(not w.broken for w in self._workers):
            return  # another worker is up or starting: the queue waits for it
        self._fail_queue(self.given_up or error)

    def _fail_queue(self, error: FnserveError) -> None:
        with self._lock:
            while self._queue:
                self._queue.popleft().future.set_exception(error)

    def _restart_broken(self) -> bool:
        """Whether to start a worker that could not start again now: at the next invocation, as Lambda does;
        at once with ``attempts``, so the pool is whole again or gives up without waiting for traffic."""
        if self._closing or self.given_up is not None:
            return False
        return bool(self._queue) or (self.attempts is not None and self._started)

    def _expire(self) -> None:
        now = time.monotonic()
        for worker in self._workers:
            if worker.job is not None and now >= worker.deadline and not worker.timed_out:
                worker.timed_out = True
                worker.process.kill()  # the sentinel fires next, and _replace answers the invocation

    def _retire(self) -> None:
        """Carry out recycle(): each worker marked, then replaced as soon as it is idle."""
        if self._recycle:
            self._recycle = False
            self.failure = None  # the new code's init decides
            self.recycles += 1
            for worker in self._workers:
                worker.retiring = True
        for index, worker in enumerate(self._workers):
            if not worker.retiring or (worker.job is not None and not worker.broken):
                continue
            with contextlib.suppress(OSError):
                worker.conn.send(None)  # exit once started: it takes no invocation any more
            self._forget(worker)  # and its exit is not a death to report
            self._retired = [p for p in self._retired if p.is_alive()] + [worker.process]
            self._workers[index] = self._spawn()

    def _assign(self) -> None:
        if self._restart_broken():
            for index, worker in enumerate(self._workers):
                if worker.broken:
                    self._workers[index] = self._spawn()
                    self.respawns += 1
        elif self.given_up is not None and all(w.broken for w in self._workers):
            self._fail_queue(self.given_up)  # no worker is left to run them
        for worker in self._workers:
            if not worker.ready or worker.job is not None or worker.timed_out:
                continue
            with self._lock:
                if not self._queue:
                    return
                job = self._queue.popleft()
            if not job.future.running() and not job.future.set_running_or_notify_cancel():
                continue
            worker.job = job
            worker.deadline = time.monotonic() + self.spec.timeout
            try:
                worker.conn.send(Invoke(job.id, job.event, self.spec.timeout))
            except OSError:
                pass  # it died: the sentinel answers the invocation
