"""The asyncio AutoLockRenewer, as ``azure.servicebus.aio``'s.

The sync renewer does the renewing, on its own thread (the locks of one
receiver that are due together go in one command per partition); its
failures are handed to the event loop, where ``on_lock_renew_failure`` (a
coroutine function, or a plain one) runs with the renewable the application
registered.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from settlement._session import ServiceBusSession as SyncSession
from settlement.aio._receiver import ServiceBusReceiver, ServiceBusSession
from settlement.lock_renewer import AutoLockRenewer as SyncRenewer
from settlement.message import ServiceBusReceivedMessage
from settlement.receiver import ServiceBusReceiver as SyncReceiver

AsyncFailureCallback = Callable[[Any, Exception | None], Awaitable[None] | None]


class AutoLockRenewer:
    """Renews registered messages' and sessions' locks until they are
    settled, their receiver closes or ``max_lock_renewal_duration`` seconds
    have passed."""

    def __init__(self, max_lock_renewal_duration: float = 300,
                 on_lock_renew_failure: AsyncFailureCallback | None = None,
                 **kwargs: Any) -> None:
        self._sync = SyncRenewer(max_lock_renewal_duration, **kwargs)
        self._on_failure = on_lock_renew_failure
        self._callbacks: set[asyncio.Task[None]] = set()

    def register(self, receiver: ServiceBusReceiver,
                 renewable: ServiceBusReceivedMessage | ServiceBusSession,
                 max_lock_renewal_duration: float | None = None,
                 on_lock_renew_failure: AsyncFailureCallback | None = None) -> None:
        """Keep ``renewable``'s lock: a message ``receiver`` received, or a
        session receiver's ``receiver.session``. Call it from the event loop."""
        if not isinstance(renewable, ServiceBusReceivedMessage | ServiceBusSession):
            raise TypeError("AutoLockRenewer renews a ServiceBusReceivedMessage (received in "
                            "PEEK_LOCK mode) or a session receiver's receiver.session")
        sync_renewable = (renewable if isinstance(renewable, ServiceBusReceivedMessage)
                          else renewable._sync())
        if sync_renewable is None:
            raise ValueError("the session is not locked yet: register receiver.session "
                             "inside 'async with receiver:'")
        self._register(asyncio.get_running_loop(), receiver._opened(), sync_renewable, renewable,
                       max_lock_renewal_duration, on_lock_renew_failure)

    def _register(self, loop: asyncio.AbstractEventLoop, receiver: SyncReceiver,
                  renewable: ServiceBusReceivedMessage | SyncSession, shown: Any,
                  max_lock_renewal_duration: float | None,
                  on_lock_renew_failure: AsyncFailureCallback | None) -> None:
        """Register with the sync renewer; its failures reach ``loop``, with
        ``shown`` (what the application knows) as the renewable."""
        callback = on_lock_renew_failure or self._on_failure

        def failed(_: Any, error: Exception | None) -> None:  # on the renewer's thread
            if callback is not None:
                loop.call_soon_threadsafe(self._report, callback, shown, error)

        self._sync.register(receiver, renewable, max_lock_renewal_duration,
                            on_lock_renew_failure=failed)

    def _for_receiver(self, receiver: ServiceBusReceiver, loop: asyncio.AbstractEventLoop
                      ) -> _ReceiverRenewals:
        """What the sync receiver under ``receiver`` takes as its
        ``auto_lock_renewer`` (``get_queue_receiver(..., auto_lock_renewer=...)``)."""
        return _ReceiverRenewals(self, receiver, loop)

    def _report(self, callback: AsyncFailureCallback, renewable: Any,
                error: Exception | None) -> None:
        outcome = callback(renewable, error)
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(outcome)
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)

    async def close(self) -> None:
        """Stop renewing; wait for failure callbacks already running."""
        await asyncio.get_running_loop().run_in_executor(None, self._sync.close)
        if self._callbacks:
            await asyncio.gather(*self._callbacks, return_exceptions=True)

    async def __aenter__(self) -> AutoLockRenewer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _ReceiverRenewals:
    """The ``auto_lock_renewer`` of a sync receiver under an asyncio one: it
    registers each message it receives (or its session, once locked) on a
    worker thread; failures reach the application's loop with the asyncio
    receiver's ``session``."""

    def __init__(self, renewer: AutoLockRenewer, receiver: ServiceBusReceiver,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._renewer = renewer
        self._receiver = receiver
        self._loop = loop

    def register(self, receiver: SyncReceiver,
                 renewable: ServiceBusReceivedMessage | SyncSession) -> None:
        shown = self._receiver.session if isinstance(renewable, SyncSession) else renewable
        self._renewer._register(self._loop, receiver, renewable, shown, None, None)
