"""Grouped settlements: concurrent ``await complete_message(m)`` calls share a command.

A coroutine that settles one message appends it to its engine window's
queue and awaits a future (holding no thread). One flusher task per window
sends everything queued as one settle command (through the client's sync
:class:`~settlement._settle_batcher.SettleBatcher`, on a worker thread, so
settles of the client's threads join the same commands), applies the
engine's answers to the messages there, and resolves each future with that
message's own answer. While a command is in flight, new
settles queue up for the next one: a thousand concurrent awaits cost a
command or two, not a thousand threads' worth of round trips.

The checks before a settle and the reading of the engine's answer are the
sync receiver's own (``_check_settleable``, ``_apply_answer``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from settlement._engine_link import check_reply
from settlement._settle_batcher import SettleBatcher, earliest
from settlement.aio._offload import Offloader
from settlement.exceptions import ServiceBusError
from settlement.message import ServiceBusReceivedMessage
from settlement.receiver import _TEXT_PER_COMMAND, _settle_item
from settlement.receiver import ServiceBusReceiver as SyncReceiver
from topics.commands import MAX_ACQUIRE, SettleItem


class _Answer(asyncio.Future[None]):
    """A settle's answer, awaited by the coroutine that settles.

    Cancelling the awaiting task cancels this future (``Task.cancel``), which
    withdraws the settle while it is queued. Once it is sent, ``cancel``
    refuses: the task is then marked cancelled and raises ``CancelledError``
    when the engine's answer comes, and the message's state is the engine's
    by then. This is what ``asyncio.shield`` and waiting out the answer did,
    without the shield's future and callbacks: a thousand concurrent
    ``await complete_message(m)`` made a Task, two futures and about five
    callbacks each, the event loop's time rather than the settlements'."""

    #: takes this answer's settle out of its window's queue; False once it
    #: was sent. Given the answer rather than holding its settle: a settle
    #: holds its answer, and a callback holding the settle made a reference
    #: cycle of each settle, its answer and its message, which only the
    #: garbage collector frees (see SettleGroups._withdrawer).
    withdraw: Callable[[_Answer], bool] | None = None

    def cancel(self, msg: Any | None = None) -> bool:
        if not self.done() and self.withdraw is not None and not self.withdraw(self):
            return False
        return super().cancel(msg)

    def abort(self) -> None:
        """Cancel it whatever happened (the client closed before it was sent)."""
        super().cancel()


@dataclass(eq=False)  # a settle is itself: found in its queue by identity
class _Settle:
    receiver: SyncReceiver
    message: ServiceBusReceivedMessage
    action: str
    item: SettleItem
    answer: _Answer

    @property
    def text(self) -> int:
        """Characters of reason and description the engine stores with it."""
        return len(self.item.reason or "") + len(self.item.description or "") + 100


class SettleGroups:
    """The settlements of one client's coroutines, grouped per engine window."""

    def __init__(self, batcher: Callable[[], SettleBatcher], offload: Offloader) -> None:
        self._batcher = batcher  # the client's; made on first use (it connects)
        self._offload = offload
        self._queued: dict[tuple[str, int], list[_Settle]] = {}
        self._flushers: dict[tuple[str, int], asyncio.Task[None]] = {}
        #: per window, what withdraws a queued settle from it (made once)
        self._withdrawers: dict[tuple[str, int], Callable[[_Answer], bool]] = {}
        self.commands_sent = 0

    async def settle(self, receiver: SyncReceiver, message: ServiceBusReceivedMessage,
                     action: str, reason: str | None = None, description: str | None = None
                     ) -> None:
        """Settle ``message`` in its window's next command; raises its own
        answer's error (if the engine refused it).

        Cancelled, a settlement is applied or not, never half: still queued,
        it is withdrawn (the message stays locked, to settle again); already
        sent, the await waits for the engine's answer before it raises
        ``CancelledError``, and the message's state is the engine's by then
        (:class:`_Answer`)."""
        await self._queue(receiver, message, action, reason, description).answer

    def _queue(self, receiver: SyncReceiver, message: ServiceBusReceivedMessage, action: str,
               reason: str | None, description: str | None) -> _Settle:
        receiver._check_open()
        receiver._check_settleable(message, action)
        window = (receiver._entity, message.partition)
        answer = _Answer(loop=asyncio.get_running_loop())
        answer.withdraw = self._withdrawer(window)
        settle = _Settle(receiver, message, action,
                         _settle_item(message, action, reason, description), answer)
        self._queued.setdefault(window, []).append(settle)
        if window not in self._flushers:
            # The task's first step runs after the coroutines already ready
            # in this loop iteration: their settles join the first command.
            self._flushers[window] = asyncio.create_task(self._flush(window))
        return settle

    def _withdrawer(self, window: tuple[str, int]) -> Callable[[_Answer], bool]:
        """What withdraws a settle of ``window`` given its answer: one for
        all of the window's settles, holding none of them, so that a settle
        sent and answered is freed by its last reference going, not left to
        the garbage collector. (With a callback per settle holding it, each
        of them, its answer and its message were a cycle: receiving 100 and
        completing each, the client's collections took 9 % of its time,
        full ones 25-35 ms three times in 20,000 messages.)"""
        withdrawer = self._withdrawers.get(window)
        if withdrawer is None:
            withdrawer = self._withdrawers[window] = functools.partial(self._withdraw, window)
        return withdrawer

    def _withdraw(self, window: tuple[str, int], answer: _Answer) -> bool:
        """Take the settle ``answer`` is for out of ``window``'s queue;
        False if it was sent."""
        queued = self._queued.get(window, [])
        for at, settle in enumerate(queued):
            if settle.answer is answer:
                del queued[at]
                return True
        return False

    async def _flush(self, window: tuple[str, int]) -> None:
        """Send the window's queued settles, a command at a time, until none is left."""
        try:
            while self._queued.get(window):
                group = self._next_group(window)
                sent = self._offload.start(self._send, window, group)
                sent.add_done_callback(functools.partial(self._answer, group))
                await asyncio.wait([sent])
        finally:
            del self._flushers[window]

    def _next_group(self, window: tuple[str, int]) -> list[_Settle]:
        """The oldest queued settles that fit in one command."""
        queued = self._queued.pop(window)
        size = text = 0
        while size < min(len(queued), MAX_ACQUIRE):
            text += queued[size].text
            if size and text > _TEXT_PER_COMMAND:
                break
            size += 1
        if queued[size:]:
            self._queued[window] = queued[size:]
        return queued[:size]

    def _send(self, window: tuple[str, int], group: list[_Settle]
              ) -> list[ServiceBusError | None]:
        """Send ``group`` as one command and apply the engine's answers to
        the messages, on a worker thread: a message's state follows the
        engine's even if the event loop stops meanwhile."""
        with ExitStack() as sending:
            # each session receiver's lock end, its release held off meanwhile
            receivers = {id(s.receiver): s.receiver for s in group}
            session_end = {key: sending.enter_context(receiver._settlement())
                           for key, receiver in receivers.items()}
            # the locks spent once for each receiver and action, not for each
            # message: the earliest end of a list is the earliest of its ends
            alike: dict[tuple[int, str], list[ServiceBusReceivedMessage]] = {}
            for settle in group:
                alike.setdefault((id(settle.receiver), settle.action), []).append(settle.message)
            final = earliest([receivers[key]._spend_locks(messages, action, session_end[key])
                              for (key, action), messages in alike.items()])
            reply = self._batcher().settle(window[0], window[1], [s.item for s in group], final)
            check_reply(reply, group[0].receiver.entity_path)
            return [settle.receiver._apply_answer(settle.message, settle.action, status, until)
                    for settle, (status, until) in zip(group, reply.statuses, strict=True)]

    def _answer(self, group: list[_Settle], sent: asyncio.Future[list[ServiceBusError | None]]
                ) -> None:
        """Tell each settle of ``group`` its answer (or the command's error)."""
        if sent.cancelled():  # the client closed before it was sent
            for settle in group:
                settle.answer.abort()
            return
        error = sent.exception()
        if error is not None:
            for settle in group:
                settle.answer.set_exception(error)
            return
        self.commands_sent += 1
        for settle, answer in zip(group, sent.result(), strict=True):
            if answer is None:
                settle.answer.set_result(None)
            else:
                settle.answer.set_exception(answer)

    async def close(self) -> None:
        """Wait for the settles in flight (a client closes after them)."""
        if self._flushers:
            await asyncio.gather(*self._flushers.values(), return_exceptions=True)
