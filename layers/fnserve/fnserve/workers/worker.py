"""A pool worker's main: import the handler once (the warm globals), then answer invocations.

Runs in a spawned process. The parent decides when workers stop: Ctrl-C or a SIGTERM to the
whole process group must not kill them under it, so they ignore both; if the parent dies
outright, the pipe closes and they exit quietly.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
from multiprocessing.connection import Connection

from fnserve.adapters.local.events import LambdaContext
from fnserve.core.errors import FnserveError, HandlerError
from fnserve.workers.messages import InitFailed, Invoke, Raised, Ready, Returned, Started


def worker_main(conn: Connection, spec_json: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = json.loads(spec_json)
    os.environ.update(spec["env"])
    sys.path.insert(0, spec["code_dir"])
    module_name, _, attribute = spec["handler"].rpartition(".")
    try:
        handler = getattr(importlib.import_module(module_name), attribute)  # warm globals: built once
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which keeps running
        reason = exc.message if isinstance(exc, FnserveError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            conn.send(InitFailed(f"{spec['handler']} failed to initialise: {reason}"))
        return
    with contextlib.suppress(EOFError, OSError):  # the pipe closes when the parent goes away: exit quietly
        conn.send(Ready())
        message: Invoke | None
        while (message := conn.recv()) is not None:
            conn.send(Started(message.id))
            context = LambdaContext(message.id, spec["name"], spec["memory_mb"], message.timeout)
            try:
                response = handler(message.event, context)
            except FnserveError as exc:
                conn.send(Raised(message.id, exc.to_dict()))
            except Exception as exc:  # noqa: BLE001 - a function error, as Lambda reports it
                conn.send(Raised(message.id, HandlerError(f"{type(exc).__name__}: {exc}").to_dict()))
            else:
                conn.send(Returned(message.id, response))
