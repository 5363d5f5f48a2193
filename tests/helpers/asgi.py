"""Requests straight into an ASGI app, without a server: fnserve's HTTP app called in the test's own process."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx


class AsgiClient:
    """Requests straight into an ASGI app (httpx's ASGI transport), synchronously."""

    def __init__(self, asgi: Any) -> None:
        self.asgi = asgi

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://fnserve") as client:
                return await client.post(path, **kwargs)

        return asyncio.run(call())


class Get:
    """GET on the ASGI app (AsgiClient only posts)."""

    def __init__(self, client: AsgiClient) -> None:
        self.asgi = client.asgi

    def __call__(self, path: str) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://fnserve", timeout=30) as c:
                return await c.get(path)

        return asyncio.run(call())
