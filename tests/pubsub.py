"""Pub/Sub for the Google Cloud tests: its Publish RPC on a loopback port, and its push delivery to a function.

Google's Pub/Sub emulator ships only with the Cloud SDK (a Java component, not on a package
registry this project installs from), so the tests stand in for the two sides fnserve talks
to: :class:`Topics` serves ``google.pubsub.v1.Publisher/Publish`` over gRPC, where the real
client library (``PUBSUB_EMULATOR_HOST``) publishes, and :func:`deliver` does what a push
subscription through Eventarc does: each message POSTed to the function as a CloudEvent in
binary content mode, redelivered with an incremented ``deliveryAttempt`` while the function
answers an error or no answer comes (a connection reset, as under load), and dead-lettered after the
subscription's max delivery attempts.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import httpx
from google.pubsub_v1.types import PublishRequest, PublishResponse

from tests.moto import free_port

MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"


@dataclass(frozen=True)
class Message:
    topic: str
    id: str
    data: bytes
    attributes: dict[str, str]


class Topics:
    """Pub/Sub's Publisher service for the topics named at start (publishing to another is NOT_FOUND)."""

    def __init__(self, *topics: str) -> None:
        self.messages: dict[str, list[Message]] = {topic: [] for topic in topics}
        self.calls = 0  # Publish RPCs: the client batches messages into them
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(
            self._publish,
            request_deserializer=PublishRequest.deserialize,
            response_serializer=PublishResponse.serialize,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", {"Publish": handler}),)
        )
        self._server.add_insecure_port(self.host)
        self._server.start()

    def _publish(self, request: PublishRequest, context: grpc.ServicerContext) -> PublishResponse:
        with self._lock:
            if request.topic not in self.messages:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Topic not found: {request.topic}")
            self.calls += 1
            ids = []
            for message in request.messages:
                ids.append(str(next(self._ids)))
                self.messages[request.topic].append(
                    Message(request.topic, ids[-1], bytes(message.data), dict(message.attributes))
                )
        return PublishResponse(message_ids=ids)

    def take(self, topic: str) -> list[Message]:
        """The messages published to ``topic`` so far, removed (as a subscription's pull would)."""
        with self._lock:
            taken, self.messages[topic] = self.messages[topic], []
        return taken

    def stop(self) -> None:
        self._server.stop(grace=None)


def cloud_event(message: Message, attempt: int, subscription: str) -> tuple[dict[str, str], bytes]:
    """Headers and body of ``message`` as Eventarc POSTs it (a CloudEvent in binary content mode)."""
    data = {
        "message": {
            "data": base64.b64encode(message.data).decode(),
            "messageId": message.id,
            "publishTime": "2026-11-22T00:00:00Z",
            "attributes": message.attributes,
        },
        "subscription": subscription,
        "deliveryAttempt": attempt,
    }
    headers = {
        "ce-id": message.id,
        "ce-source": f"//pubsub.googleapis.com/{message.topic}",
        "ce-type": MESSAGE_PUBLISHED,
        "ce-specversion": "1.0",
        "content-type": "application/json",
    }
    return headers, json.dumps(data).encode()


#: The status recorded for a push that got no answer: Pub/Sub counts it a failed attempt and redelivers.
LOST = 0


@dataclass
class Delivery:
    """What push delivery did: every attempt's status per message id (:data:`LOST` where no answer came),
    and the dead-lettered messages."""

    statuses: dict[str, list[int]] = field(default_factory=dict)
    dead_lettered: list[Message] = field(default_factory=list)

    def answers(self, message_id: str) -> list[int]:
        """The statuses the function answered ``message_id`` with, pushes that got no answer left out."""
        return [status for status in self.statuses[message_id] if status != LOST]

    @property
    def lost(self) -> int:
        """How many pushes got no answer (each may or may not have reached the function)."""
        return sum(statuses.count(LOST) for statuses in self.statuses.values())


def deliver(
    url: str,
    messages: Sequence[Message],
    *,
    max_attempts: int = 5,
    attempt: int = 1,
    concurrency: int = 64,
    subscription: str = "",
) -> Delivery:
    """Push ``messages`` to the function at ``url``, ``concurrency`` at a time, as a push subscription with a
    dead-letter policy does: a 2xx acknowledges; anything else is redelivered (attempt + 1), up to
    ``max_attempts`` deliveries (the first one numbered ``attempt``), after which the message goes to the
    dead-letter topic."""
    delivery = Delivery()
    subscription = subscription or "projects/test/subscriptions/jobs"

    async def push(client: httpx.AsyncClient, gate: asyncio.Semaphore, message: Message) -> None:
        for n in range(attempt, attempt + max_attempts):
            headers, body = cloud_event(message, n, subscription)
            async with gate:
                try:
                    status = (await client.post(url, headers=headers, content=body)).status_code
                except httpx.TransportError:
                    status = LOST
            delivery.statuses.setdefault(message.id, []).append(status)
            if 200 <= status < 300:
                return
        delivery.dead_lettered.append(message)

    async def run() -> None:
        gate = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(push(client, gate, message) for message in messages))

    asyncio.run(run())
    return delivery
