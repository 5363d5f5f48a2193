"""A template's container-image functions (``PackageType: Image``), run by the emulator from their image.

Each warm worker is a container of the function's image, started as Lambda starts one: the image's
ENTRYPOINT with the function's ``ImageConfig.Command``, a user that is not root, and
``AWS_LAMBDA_RUNTIME_API`` pointing at a :class:`~fnserve.emulator.runtime_api.RuntimeApi` of its
own on loopback. There is no Docker engine to ask: containers are started by Debian's ``buildah`` (as
root, chroot isolation, the host's network, so the function reaches the emulator's AWS endpoint on
127.0.0.1). :class:`ImagePool` has the interface of :class:`~fnserve.workers.pool.WorkerPool`, so the
gateway, the SQS pollers and the schedules invoke either alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from fnserve.core.errors import ConfigError, HandlerError, InvocationTimeout, WorkerDied
from fnserve.emulator.runtime_api import FunctionError, InitError, RuntimeApi, RuntimeExited
from fnserve.workers.pool import FunctionSpec, Observer

BUILDAH = ["buildah", "--storage-driver", "vfs"]
LAMBDA_USER = "993:990"  # Lambda runs an image as a user that is neither root nor the image's own


def buildah(*args: str) -> str:
    done = subprocess.run([*BUILDAH, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"buildah {' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout.strip()


def image_exists(image: str) -> bool:
    """Whether ``image`` is in buildah's local storage."""
    return subprocess.run([*BUILDAH, "inspect", "--type", "image", image], capture_output=True).returncode == 0


def image_config(image: str) -> dict[str, Any]:
    """The image's configuration (Entrypoint, Cmd, Env, User, WorkingDir); pulled when it is not here."""
    if shutil.which("buildah") is None:
        raise ConfigError(
            f"{image} is a container image: fnserve local starts images with buildah, which is not installed "
            "(Debian: apt-get install buildah; it runs as root)"
        )
    if not image_exists(image):
        buildah("pull", "--quiet", image)
    config: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", image))["Docker"]["config"]
    return config


@dataclass
class Container:
    """``command`` running in a new container of ``image``, on the host's network; :meth:`stop` removes it."""

    image: str
    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    volumes: Mapping[str, str] = field(default_factory=dict)  # host path -> path in the container
    output: IO[bytes] | int = subprocess.DEVNULL
    name: str = ""
    process: subprocess.Popen[bytes] | None = None

    def create(self) -> Container:
        """The container, made from the image (with vfs storage, a copy of its files), not yet running."""
        if not self.name:
            self.name = buildah("from", "--quiet", "--pull=false", self.image)
        return self

    def start(self) -> Container:
        self.create()
        args = [arg for key, value in self.env.items() for arg in ("--env", f"{key}={value}")]
        args += [arg for host, inside in self.volumes.items() for arg in ("--volume", f"{host}:{inside}")]
        if self.user is not None:
            args += ["--user", self.user]
        self.process = subprocess.Popen(
            [*BUILDAH, "run", "--isolation", "chroot", *args, self.name, "--", *self.command],
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def exec(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Another command in the same container (a HEALTHCHECK, say), as the image's user."""
        return subprocess.run(
            [*BUILDAH, "run", "--isolation", "chroot", self.name, "--", *command],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (buildah passes it on), SIGKILL to what is left after ``grace`` seconds; then remove it."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if self.name:
            subprocess.run([*BUILDAH, "rm", self.name], capture_output=True)
            self.name = ""


@dataclass
class _Runtime:
    """One warm container and the Runtime API it polls."""

    api: RuntimeApi
    container: Container
    busy: bool = False


class ImagePool:
    """``workers`` containers of an image function (``spec.image``, run with ``spec.command``).

    As Lambda resets an execution environment whose invocation timed out or whose runtime exited, a container
    that does either is replaced by a new one (a cold start), and the invocation is answered at once.
    """

    def __init__(self, spec: FunctionSpec, workers: int = 1, observer: Observer | None = None) -> None:
        self.spec = spec
        self._size = workers
        self.observer = observer
        self._runtimes: list[_Runtime] = []
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Runtime] = queue.Queue()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"image-{spec.name}")
        self._closing = False
        self._command: list[str] = []
        self._env: dict[str, str] = {}

    def start(self, wait_ready: float = 120.0) -> ImagePool:
        """Start the containers and wait until each has initialised (its first poll of the Runtime API).

        :class:`HandlerError` with the function's init error if one cannot start (the pool is closed then)."""
        config = image_config(self.spec.image)
        self._command = [*(config.get("Entrypoint") or []), *(self.spec.command or config.get("Cmd") or [])]
        self._env = {
            **self.spec.env,
            "AWS_LAMBDA_FUNCTION_NAME": self.spec.name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.spec.memory_mb),
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        }
        try:
            started = [self._start_one() for _ in range(self._size)]
            for runtime in started:
                self._check_ready(runtime, wait_ready)
                self._idle.put(runtime)
        except BaseException:
            self.close()
            raise
        return self

    def _start_one(self) -> _Runtime:
        api = RuntimeApi(self.spec.name, timeout=self.spec.timeout)
        env = {**self._env, "AWS_LAMBDA_RUNTIME_API": api.address}
        runtime = _Runtime(api, Container(self.spec.image, self._command, env, LAMBDA_USER, output=subprocess.PIPE))
        with self._lock:
            self._runtimes.append(runtime)
        runtime.container.start()
        threading.Thread(target=self._relay, args=(runtime,), daemon=True).start()
        return runtime

    def _check_ready(self, runtime: _Runtime, wait_ready: float) -> None:
        if not runtime.api.wait_initialised(wait_ready):
            raise TimeoutError(f"function {self.spec.name}: its container did not start in {wait_ready:g}s")
        if (error := runtime.api.init_error) is not None:
            reason = f"{error.get('errorType')}: {error.get('errorMessage')}"
            raise HandlerError(f"function {self.spec.name} cannot start: {reason}")
        if runtime.container.process is None or runtime.container.process.poll() is not None:
            raise HandlerError(f"function {self.spec.name} cannot start: its container exited; see its output")

    def invoke(self, event: Any) -> Future[Any]:
        """Queue one invocation; the future gets the handler's response or a :class:`FnserveError`."""
        if self._closing:
            future: Future[Any] = Future()
            future.set_exception(WorkerDied(f"function {self.spec.name} is shutting down"))
            return future
        return self._executor.submit(self._invoke, event)

    def _invoke(self, event: Any) -> Any:
        while True:  # an idle container, unless the pool closes first
            try:
                runtime = self._idle.get(timeout=0.1)
                break
            except queue.Empty:
                if self._closing:
                    raise WorkerDied(f"function {self.spec.name} shut down") from None
        request_id = uuid.uuid4().hex
        runtime.busy = True
        response: Any = None
        error: str | None = None
        reset = False
        if self.observer is not None:
            self.observer.started(self.spec, request_id)
        try:
            response = runtime.api.invoke(event)
            return response
        except (InitError, RuntimeExited) as exc:
            error, reset = str(exc), True
            raise WorkerDied(f"function {self.spec.name}: its container stopped: {exc}") from None
        except FunctionError as exc:
            error = str(exc)
            raise HandlerError(str(exc)) from None
        except TimeoutError:
            error, reset = f"timed out after {self.spec.timeout:g} s", True
            raise InvocationTimeout(f"function {self.spec.name} {error}") from None
        finally:
            runtime.busy = False
            if reset and not self._closing:  # in the background: the caller has its answer now
                threading.Thread(target=self._replace, args=(runtime,), daemon=True).start()
            else:
                self._idle.put(runtime)
            if self.observer is not None:
                self.observer.finished(self.spec, request_id, event, response, error, None)

    def _replace(self, runtime: _Runtime) -> None:
        """A new container in place of ``runtime``'s; the next invocation pays its cold start."""
        runtime.container.stop(grace=0)
        runtime.api.close()
        with self._lock:
            self._runtimes.remove(runtime)
        if self._closing:
            return
        fresh = self._start_one()
        fresh.api.wait_initialised(120.0)  # an init error is the next invocation's answer, as on Lambda
        self._idle.put(fresh)

    def _relay(self, runtime: _Runtime) -> None:
        """The container's output, line by line, to the observer (the console); at its end, the container has
        exited, and whatever waits on it is told so."""
        process = runtime.container.process
        if process is None or process.stdout is None:
            return
        with process.stdout:
            for line in process.stdout:
                if self.observer is not None:
                    self.observer.output(self.spec, None, line.decode(errors="replace"))
        runtime.api.exited(f"the container exited with status {process.wait()}")

    def recycle(self) -> None:
        """Nothing to reload: an image's code changes only with a new image (restart fnserve local)."""

    def close(self, grace: float = 5.0) -> None:
        if self._closing:
            return
        self._closing = True
        with self._lock:
            runtimes = list(self._runtimes)
        for runtime in runtimes:
            runtime.container.stop(grace)
            runtime.api.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def size(self) -> int:
        return self._size

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [r.container.process.pid for r in self._runtimes if r.container.process is not None]

    def busy(self) -> int:
        with self._lock:
            return sum(1 for r in self._runtimes if r.busy)
