"""App factories for ``fronts.run`` and ``fronts.serve_first``: ``factory``'s front processes after the first wait
for a file before they start, so a test sees the server while only the first listens (each answers its pid, with 200
once the server is ready, ``fronts.all_listening``, else 503); ``broken``'s never start."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fnserve.server import fronts

GATE_ENV = "FNSERVE_TEST_GATE"  # the file that lets the front processes after the first start


def factory() -> Any:
    gate = Path(os.environ[GATE_ENV])
    try:
        gate.with_suffix(".first").touch(exist_ok=False)  # the first front process to get here goes on at once
    except FileExistsError:
        deadline = time.monotonic() + 60
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    listening = fronts.all_listening()
    assert listening is not None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await listening.start()
                await send({"type": "lifespan.startup.complete"})
            await listening.stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = json.dumps({"pid": os.getpid()}).encode()
        await send({"type": "http.response.start", "status": 200 if listening() else 503, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


def broken() -> Any:
    raise RuntimeError("this front process cannot start")
