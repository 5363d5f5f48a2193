"""Something a server's process does now and then on its event loop, and once more as it stops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Every:
    """A companion of an app (its lifespan starts and stops it): ``action`` every ``seconds``, and at stop."""

    def __init__(self, seconds: float, action: Callable[[], None]) -> None:
        self.seconds = seconds
        self.action = action
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        async def every_interval() -> None:
            while True:
                await asyncio.sleep(self.seconds)
                self.action()

        self._task = asyncio.get_running_loop().create_task(every_interval())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.action()
