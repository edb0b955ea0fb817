"""Helpers of the settlement.aio tests."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from settlement import ServiceBusMessage
from settlement.aio import ServiceBusClient, ServiceBusReceiver


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Tests are sync functions that run their coroutine (no pytest-asyncio)."""
    return asyncio.run(coro)


async def send(client: ServiceBusClient, queue: str, *bodies: str, **options: Any) -> None:
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(b, message_id=b, **options)
                                    for b in bodies])


async def receive_all(receiver: ServiceBusReceiver, count: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < count:
        batch = await receiver.receive_messages(count - len(got), max_wait_time=10)
        assert batch, f"received {len(got)} of {count}"
        got += batch
    return got
