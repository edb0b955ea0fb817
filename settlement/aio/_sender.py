"""The asyncio ServiceBusSender, as ``azure.servicebus.aio``'s: the sync
sender (durable, acknowledged sends) on the client's worker threads.

A cancelled send, schedule or cancellation of scheduled messages is done or
not, never left running unknown: if it had not started it never runs;
otherwise the cancelled await waits for its end before it raises
``CancelledError`` (sending again may then duplicate what it sent: give
messages a ``message_id`` on a queue with duplicate detection)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

from settlement.aio._offload import Offloader
from settlement.batch import ServiceBusMessageBatch
from settlement.message import Sendable
from settlement.sender import ServiceBusSender as SyncSender


class ServiceBusSender:
    """Sends to one queue or topic; each send returns once the broker has
    durably accepted every message. Made on first use, so creating one never
    blocks the event loop."""

    def __init__(self, make: Callable[[], SyncSender], offload: Offloader) -> None:
        self._make = make
        self._offload = offload
        self._sync: SyncSender | None = None

    async def _sender(self) -> SyncSender:
        if self._sync is None:
            self._sync = await self._offload.run(self._make, if_abandoned=SyncSender.close)
        return self._sync

    async def send_messages(self, message: Sendable | Iterable[Sendable] | ServiceBusMessageBatch,
                            *, timeout: float | None = None,
                            **kwargs: Any) -> None:
        """As :meth:`settlement.ServiceBusSender.send_messages`."""
        sender = await self._sender()
        await self._offload.run_to_end(sender.send_messages, message, timeout=timeout, **kwargs)

    async def schedule_messages(self, messages: Sendable | Iterable[Sendable],
                                schedule_time_utc: dt.datetime, **kwargs: Any) -> list[int]:
        sender = await self._sender()
        return await self._offload.run_to_end(sender.schedule_messages, messages,
                                              schedule_time_utc, **kwargs)

    async def cancel_scheduled_messages(self, sequence_numbers: int | Iterable[int],
                                        **kwargs: Any) -> None:
        sender = await self._sender()
        await self._offload.run_to_end(sender.cancel_scheduled_messages, sequence_numbers, **kwargs)

    async def create_message_batch(self, max_size_in_bytes: int | None = None
                                   ) -> ServiceBusMessageBatch:
        sender = await self._sender()
        return await self._offload.run(sender.create_message_batch, max_size_in_bytes)

    async def close(self) -> None:
        if self._sync is not None:
            await self._offload.run(self._sync.close)

    async def __aenter__(self) -> ServiceBusSender:
        await self._sender()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
