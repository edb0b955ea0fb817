"""The asyncio ServiceBusReceiver and ServiceBusSession, as ``azure.servicebus.aio``'s.

Each wraps its sync twin, which owns the wire format and the lock state:
receives, peeks and session calls run on the client's worker threads;
complete, abandon and defer are grouped per engine window
(:mod:`settlement.aio._settle_groups`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from typing import Any

from settlement._session import ServiceBusSession as SyncSession
from settlement.aio._offload import Offloader
from settlement.aio._settle_groups import SettleGroups
from settlement.message import ServiceBusReceivedMessage
from settlement.receiver import LockRenewer
from settlement.receiver import ServiceBusReceiver as SyncReceiver

#: How the ``auto_lock_renewer`` given to the asyncio client becomes the sync
#: receiver's, once the asyncio receiver and its event loop are known
#: (:meth:`settlement.aio.ServiceBusClient.get_queue_receiver` makes it).
SyncRenewal = Callable[["ServiceBusReceiver", asyncio.AbstractEventLoop], LockRenewer]


class ServiceBusReceiver:
    """Receives from a queue, a subscription or a dead-letter sub-queue.

    Made by :class:`settlement.aio.ServiceBusClient`; opens (looks the
    entity up, locks its session) on ``async with`` or its first call, as
    the SDK's does, so creating one never blocks the event loop."""

    def __init__(self, make: Callable[..., SyncReceiver], offload: Offloader,
                 settles: SettleGroups, *, session: bool,
                 renewal: SyncRenewal | None = None) -> None:
        self._make = make
        self._renewal_of = renewal
        self._offload = offload
        self._settles = settles
        self._sync: SyncReceiver | None = None
        self._opening = asyncio.Lock()
        self._session = ServiceBusSession(self) if session else None

    async def _receiver(self) -> SyncReceiver:
        """The sync receiver, made (and its session locked) on first use."""
        if self._sync is None:
            async with self._opening:
                if self._sync is None:
                    receiver = await self._offload.run(self._make, **self._renewal())
                    await self._offload.run(receiver._open)
                    self._sync = receiver
        return self._sync

    def _renewal(self) -> dict[str, Any]:
        """The sync receiver's ``auto_lock_renewer``, made for this receiver
        and its event loop."""
        if self._renewal_of is None:
            return {}
        return {"auto_lock_renewer": self._renewal_of(self, asyncio.get_running_loop())}

    def _opened(self) -> SyncReceiver:
        if self._sync is None:
            raise ValueError("the receiver is not open yet: use it in 'async with receiver:' "
                             "or receive from it first")
        return self._sync

    @property
    def session(self) -> ServiceBusSession | None:
        """The session of a session receiver (None otherwise; a session-enabled
        entity's dead-letter sub-queue has no sessions)."""
        if self._sync is not None and self._sync.session is None:
            return None
        return self._session

    @property
    def entity_path(self) -> str:
        return self._opened().entity_path

    @property
    def receive_mode(self) -> Any:
        return self._opened().receive_mode

    # ----------------------------------------------------------------- receive
    async def receive_messages(self, max_message_count: int | None = 1,
                               max_wait_time: float | None = None
                               ) -> list[ServiceBusReceivedMessage]:
        """As :meth:`settlement.ServiceBusReceiver.receive_messages`."""
        receiver = await self._receiver()
        return await self._offload.run(receiver.receive_messages, max_message_count,
                                       max_wait_time)

    async def __aiter__(self) -> AsyncIterator[ServiceBusReceivedMessage]:
        """Messages as they come; stops after the receiver's ``max_wait_time``
        without one. The sync receiver's loop runs underneath, a step per
        message on a worker thread: its adaptive prefetch, and the release
        of messages locked but not handed out when the loop ends, hold here."""
        receiver = await self._receiver()
        messages = iter(receiver)
        try:
            while True:
                message = await self._offload.run(next, messages, None)
                if message is None:
                    return
                yield message
        finally:
            await self._offload.run(messages.close)

    async def peek_messages(self, max_message_count: int = 1, *,
                            sequence_number: int | None = None, **kwargs: Any
                            ) -> list[ServiceBusReceivedMessage]:
        receiver = await self._receiver()
        return await self._offload.run(receiver.peek_messages, max_message_count,
                                       sequence_number=sequence_number, **kwargs)

    async def receive_deferred_messages(self, sequence_numbers: int | list[int], **kwargs: Any
                                        ) -> list[ServiceBusReceivedMessage]:
        receiver = await self._receiver()
        return await self._offload.run(receiver.receive_deferred_messages, sequence_numbers,
                                       **kwargs)

    # ------------------------------------------------------------------ settle
    async def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        """Complete ``message``; concurrent calls share one engine command."""
        await self._settles.settle(self._sync or await self._receiver(), message, "complete")

    async def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        receiver = self._sync or await self._receiver()
        if receiver._unseen:  # a session's messages locked with it go back before it
            await self._offload.run(receiver._return_unseen)
        await self._settles.settle(receiver, message, "abandon")

    async def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        await self._settles.settle(self._sync or await self._receiver(), message, "defer")

    async def dead_letter_message(self, message: ServiceBusReceivedMessage,
                                  reason: str | None = None,
                                  error_description: str | None = None) -> None:
        receiver = await self._receiver()
        await self._offload.run(receiver.dead_letter_message, message, reason,
                                error_description)

    async def renew_message_lock(self, message: ServiceBusReceivedMessage, **kwargs: Any
                                 ) -> dt.datetime:
        """Extend the lock by the entity's lock duration; return the new end."""
        receiver = await self._receiver()
        return await self._offload.run(receiver.renew_message_lock, message, **kwargs)

    # ---------------------------------------------------------------- lifetime
    async def close(self) -> None:
        if self._sync is not None:
            await self._offload.run(self._sync.close)

    async def __aenter__(self) -> ServiceBusReceiver:
        await self._receiver()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ServiceBusSession:
    """``receiver.session`` of a session receiver: ``session_id``,
    ``locked_until_utc``, and awaitable ``get_state``, ``set_state`` and
    ``renew_lock``, over the sync :class:`settlement.ServiceBusSession`."""

    def __init__(self, receiver: ServiceBusReceiver) -> None:
        self._receiver = receiver

    def _sync(self) -> SyncSession | None:
        receiver = self._receiver._sync
        return None if receiver is None else receiver.session

    @property
    def session_id(self) -> str | None:
        """The session's id (for NEXT_AVAILABLE_SESSION: once it is locked)."""
        session = self._sync()
        return None if session is None else session.session_id

    @property
    def locked_until_utc(self) -> dt.datetime | None:
        session = self._sync()
        return None if session is None else session.locked_until_utc

    @property
    def auto_renew_error(self) -> Exception | None:
        session = self._sync()
        return None if session is None else session.auto_renew_error

    async def _opened(self) -> SyncSession:
        session = (await self._receiver._receiver()).session
        assert session is not None
        return session

    async def get_state(self, *, timeout: float | None = None, **kwargs: Any) -> bytes | None:
        session = await self._opened()
        return await self._receiver._offload.run(session.get_state, timeout=timeout, **kwargs)

    async def set_state(self, state: str | bytes | bytearray | None, *,
                        timeout: float | None = None, **kwargs: Any) -> None:
        session = await self._opened()
        await self._receiver._offload.run(session.set_state, state, timeout=timeout, **kwargs)

    async def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> dt.datetime:
        session = await self._opened()
        return await self._receiver._offload.run(session.renew_lock, timeout=timeout,
                                                 **kwargs)
