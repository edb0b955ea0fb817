"""The asyncio ServiceBusReceiver and ServiceBusSession, as ``azure.servicebus.aio``'s.

Each wraps its sync twin, which owns the wire format and the lock state:
receives, peeks and session calls run on the client's worker threads;
complete, abandon and defer are grouped per engine window
(:mod:`settlement.aio._settle_groups`). A receive waits for messages on the
event loop, holding a thread only for each round trip to the engine.

Cancelling an await (``asyncio.wait_for``, ``task.cancel()``, a shutdown)
leaves nothing behind:

* a receive (``receive_messages``, ``receive_deferred_messages``, the next
  step of ``async for``): what its round trip in flight locks is released as
  soon as it returns, counting no delivery, so the next receiver gets those
  messages at once; messages a loop locked but had not handed out are
  released when the loop ends or the receiver closes;
* a settlement (complete, abandon, defer, dead-letter) is applied or not,
  never half: withdrawn if its command was not sent yet; otherwise the
  cancelled await waits for the engine's answer, and the message's state
  (settled, or locked and settleable again) is the engine's;
* a lock renewal, a session's state or lock renewal: as a sent settlement;
* opening a session receiver: a session locked after the cancellation is
  released at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import deque
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
        #: the batches of running ``async for`` loops, what is not handed out yet
        self._in_loops: list[deque[ServiceBusReceivedMessage]] = []

    async def _receiver(self) -> SyncReceiver:
        """The sync receiver, made (and its session locked) on first use."""
        if self._sync is None:
            async with self._opening:
                if self._sync is None:
                    receiver = await self._offload.run(self._make, if_abandoned=SyncReceiver.close,
                                                       **self._renewal())
                    try:
                        await self._open(receiver)
                    except BaseException:  # after a try in flight has released what it locked
                        await self._offload.wait_abandoned()
                        await self._offload.run_to_end(receiver.close)
                        raise
                    self._sync = receiver
        return self._sync

    async def _open(self, receiver: SyncReceiver) -> None:
        """The sync receiver's ``_open``, its waits for a free session on the
        event loop; a session locked after its caller was cancelled is
        released at once."""
        session = receiver.session
        if session is None:
            return
        for pause in session.pauses():
            await asyncio.sleep(pause)
            if await self._offload.run(receiver._try_open,
                                       if_abandoned=lambda _: receiver.close()):
                return
        raise session.none_available()

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
        """As :meth:`settlement.ServiceBusReceiver.receive_messages`.
        Cancelled, whatever it locked goes back at once, its delivery count
        untouched."""
        receiver = await self._receiver()
        got = await self._receive(receiver, max(1, max_message_count or 1), max_wait_time)
        receiver._renew_automatically(got)
        return got

    async def _receive(self, receiver: SyncReceiver, want: int, max_wait_time: float | None
                       ) -> list[ServiceBusReceivedMessage]:
        """The sync receiver's receive, with its pauses between rounds on the
        event loop: a thread is held for a round trip, not for the wait. A
        round trip whose caller is cancelled releases what it locked."""
        got = await self._offload.run(receiver._then_read_ahead, receiver._first_round, want,
                                      if_abandoned=receiver._release)
        if not got:
            for pause in receiver._pauses(max_wait_time):
                await asyncio.sleep(pause)
                receiver._check_open()
                got = await self._offload.run(receiver._then_read_ahead,
                                              receiver._receive_round, want,
                                              if_abandoned=receiver._release)
                if got:
                    break
        return got

    async def __aiter__(self) -> AsyncIterator[ServiceBusReceivedMessage]:
        """Messages as they come; stops after the receiver's ``max_wait_time``
        without one. As the sync receiver's loop: its adaptive prefetch, and
        the release of messages locked but not handed out when the loop ends
        (``break``, an error, a cancelled task) or the receiver closes."""
        receiver = await self._receiver()
        want = receiver._prefetch
        while not receiver._closed:
            batch = await self._receive(receiver, want, None)
            if not batch:
                return
            started = time.monotonic()
            rest = deque(batch)
            self._in_loops.append(rest)
            try:
                while rest:
                    message = rest.popleft()
                    receiver._renew_automatically([message])  # not those released unseen
                    yield message
            finally:
                self._in_loops.remove(rest)
                if rest:
                    await self._offload.run_to_end(receiver._release, list(rest))
            want = receiver._loop_want(want, started)
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
                                       if_abandoned=receiver._release, **kwargs)

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
        await self._offload.run_to_end(receiver.dead_letter_message, message, reason,
                                       error_description)

    async def renew_message_lock(self, message: ServiceBusReceivedMessage, **kwargs: Any
                                 ) -> dt.datetime:
        """Extend the lock by the entity's lock duration; return the new end."""
        receiver = await self._receiver()
        return await self._offload.run_to_end(receiver.renew_message_lock, message, **kwargs)

    # ---------------------------------------------------------------- lifetime
    async def close(self) -> None:
        """Release what running loops locked and did not hand out, and what
        cancelled receives locked, then close."""
        if self._sync is None:
            return
        unhanded = [m for rest in self._in_loops for m in rest]
        for rest in self._in_loops:
            rest.clear()
        if unhanded:
            await self._offload.run_to_end(self._sync._release, unhanded)
        await self._offload.wait_abandoned()
        await self._offload.run_to_end(self._sync.close)

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
        await self._receiver._offload.run_to_end(session.set_state, state, timeout=timeout,
                                                 **kwargs)

    async def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> dt.datetime:
        session = await self._opened()
        return await self._receiver._offload.run_to_end(session.renew_lock, timeout=timeout,
                                                        **kwargs)
