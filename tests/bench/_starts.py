"""Fresh starts, timed from the moment a process is started to its first answer: a Lambda function's through a
Runtime API of its own, a server's through HTTP; with what its processes hold and wrote by then (bench_start)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fnserve.bench.sweep import process_tree
from fnserve.emulator.runtime_api import FunctionError, RuntimeApi
from tests.moto import free_port

START_WITHIN_S = 120.0
POLL_SECONDS = 0.01  # between requests while a server starts: the figures' resolution
clock = time.perf_counter


@dataclass
class Started:
    seconds: float
    rss_mb: float
    answer: Any
    output: str  # what its processes wrote until the first answer: log lines, import times
    wall: float  # time.time() at the start, for the log's timestamps
    init: float | None = None  # a function's: its start to its first poll for an event (Lambda's init phase)


Start = Callable[[Path, dict[str, str]], Started]  # a log file and extra environment -> one fresh start


def python_rss_mb(pid: int) -> float:
    """The sum of VmHWM over the Python processes of ``pid``'s tree (not buildah's)."""
    total = 0
    for member in process_tree(pid):
        try:
            if "python" not in os.readlink(f"/proc/{member}/exe"):
                continue
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:  # gone meanwhile
            continue
        found = re.search(r"VmHWM:\s+(\d+) kB", status)
        total += int(found.group(1)) if found else 0
    return total / 1024


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as a platform stops it; then SIGKILL to whatever of its process group is left."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def tail(log: Path) -> str:
    return log.read_bytes()[-3000:].decode(errors="replace")


@contextlib.contextmanager
def launched(
    log: Path, launch: Callable[[IO[bytes]], subprocess.Popen[bytes]]
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], tuple[float, float, int]]]]:
    """The process ``launch`` starts, writing to ``log``, and a function taking its figures at the first answer:
    seconds since the start, peak RSS, how much it had written; stopped after."""
    with log.open("wb") as out:
        began = clock()
        process = launch(out)
        try:
            yield process, lambda: (clock() - began, python_rss_mb(process.pid), os.fstat(out.fileno()).st_size)
        finally:
            stop(process)


def lambda_start(command: list[str], cwd: Path, env: dict[str, str], event: Callable[[], Any]) -> Start:
    """A function's start: its process polls a Runtime API of its own for the event; the start ends at its answer."""

    def start(log: Path, extra: dict[str, str]) -> Started:
        sent = event()
        with RuntimeApi(timeout=START_WITHIN_S) as api:
            api._server.handle_error = _reset  # type: ignore[method-assign]
            wall, began, initialised = time.time(), clock(), []
            run = {**env, **extra, "AWS_LAMBDA_RUNTIME_API": api.address}

            def popen(out: IO[bytes]) -> subprocess.Popen[bytes]:
                process = subprocess.Popen(
                    command, cwd=cwd, env=run, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
                threading.Thread(target=lambda: api.exited(f"exit status {process.wait()}"), daemon=True).start()
                threading.Thread(target=init, daemon=True).start()
                return process

            def init() -> None:  # its first GET next: the end of its init
                if api.wait_initialised(START_WITHIN_S):
                    initialised.append(clock() - began)

            with launched(log, popen) as (_, figures):
                try:
                    answer = api.invoke(sent)
                except (FunctionError, TimeoutError) as exc:
                    raise RuntimeError(f"{' '.join(command)}: {exc}\n{tail(log)}") from exc
                seconds, rss, size = figures()
        output = log.read_bytes()[:size].decode(errors="replace")
        return Started(seconds, rss, answer, output, wall, initialised[0] if initialised else None)

    return start


def _reset(request: Any, client_address: Any) -> None:
    """A runtime stopped between two of its requests resets its connection: no error here."""


def post(port: int, path: str, body: bytes) -> tuple[int | None, bytes]:
    """One request on a new connection; (None, b"") where nothing answers yet."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body, {"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        connection.close()


Launch = Callable[[int, dict[str, str], IO[bytes]], subprocess.Popen[bytes]]  # port, extra environment, output


def http_start(launch: Launch, served: str, request: dict[str, Any]) -> Start:
    """A server's start: ``request`` to ``served``'s V2 inference route every POLL_SECONDS from the start, until one
    is answered 200."""
    body = json.dumps(request).encode()
    path = f"/v2/models/{served}/infer"

    def start(log: Path, extra: dict[str, str]) -> Started:
        port = free_port()
        wall, deadline = time.time(), clock() + START_WITHIN_S
        with launched(log, lambda out: launch(port, extra, out)) as (process, figures):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{served}: exited with {process.returncode} before its first answer\n{tail(log)}"
                    )
                if clock() > deadline:
                    raise TimeoutError(f"{served}: no answer within {START_WITHIN_S:g} s\n{tail(log)}")
                status, answer = post(port, path, body)
                if status == 200:
                    break
                if status not in (None, 503):  # 503: starting, its models loading
                    raise RuntimeError(f"{served}: {status} {answer[:500]!r}\n{tail(log)}")
                time.sleep(POLL_SECONDS)
            seconds, rss, size = figures()
        return Started(seconds, rss, json.loads(answer), log.read_bytes()[:size].decode(errors="replace"), wall)

    return start
