"""Grouped settlements: concurrent ``await complete_message(m)`` calls share a command.

A coroutine that settles one message appends it to its engine window's
queue and awaits a future. One flusher task per window sends everything
queued as one settle command (through the client's sync
:class:`~settlement._settle_batcher.SettleBatcher`, on a worker thread, so
settles of the client's threads join the same commands) and resolves each
future with that message's own answer. While a command is in flight, new
settles queue up for the next one: a thousand concurrent awaits cost a
command or two, not a thousand threads' worth of round trips.

The checks before a settle and the reading of the engine's answer are the
sync receiver's own (``_check_settleable``, ``_apply_answer``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from settlement._engine_link import check_reply
from settlement._settle_batcher import SettleBatcher, earliest
from settlement.aio._offload import Offloader
from settlement.message import ServiceBusReceivedMessage
from settlement.receiver import _TEXT_PER_COMMAND, _settle_item
from settlement.receiver import ServiceBusReceiver as SyncReceiver
from topics.commands import MAX_ACQUIRE, SettleItem


@dataclass
class _Settle:
    receiver: SyncReceiver
    message: ServiceBusReceivedMessage
    action: str
    item: SettleItem
    answer: asyncio.Future[None]

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
        self.commands_sent = 0

    def settle(self, receiver: SyncReceiver, message: ServiceBusReceivedMessage, action: str,
               reason: str | None = None, description: str | None = None
               ) -> asyncio.Future[None]:
        """Queue the settlement of ``message``; the future ends with its own
        answer (its error, if the engine refused it). A plain function, not a
        coroutine: a thousand concurrent calls cost a thousand fewer frames."""
        receiver._check_open()
        receiver._check_settleable(message, action)
        settle = _Settle(receiver, message, action,
                         _settle_item(message, action, reason, description),
                         asyncio.get_running_loop().create_future())
        window = (receiver._entity, message.partition)
        self._queued.setdefault(window, []).append(settle)
        if window not in self._flushers:
            # The task's first step runs after the coroutines already ready
            # in this loop iteration: their settles join the first command.
            self._flushers[window] = asyncio.create_task(self._flush(window))
        return settle.answer

    async def _flush(self, window: tuple[str, int]) -> None:
        """Send the window's queued settles, a command at a time, until none is left."""
        try:
            while self._queued.get(window):
                group = self._next_group(window)
                await self._send(window, group)
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

    async def _send(self, window: tuple[str, int], group: list[_Settle]) -> None:
        with ExitStack() as sending:
            # each session receiver's lock end, its release held off meanwhile
            receivers = {id(s.receiver): s.receiver for s in group}
            session_end = {key: sending.enter_context(receiver._settlement())
                           for key, receiver in receivers.items()}
            final = earliest([s.receiver._spend_locks([s.message], s.action,
                                                      session_end[id(s.receiver)])
                              for s in group])
            try:
                reply = await self._offload.run(lambda: self._batcher().settle(
                    window[0], window[1], [s.item for s in group], final))
                self.commands_sent += 1
                check_reply(reply, group[0].receiver.entity_path)
                answers = reply.statuses
            except asyncio.CancelledError:  # the loop is closing: every waiter must hear
                for settle in group:
                    settle.answer.cancel()
                raise
            except Exception as exc:
                for settle in group:
                    if not settle.answer.done():
                        settle.answer.set_exception(exc)
                return
            for settle, (status, until) in zip(group, answers, strict=True):
                error = settle.receiver._apply_answer(settle.message, settle.action, status, until)
                if settle.answer.done():
                    continue  # its caller was cancelled; the settlement stands
                if error is None:
                    settle.answer.set_result(None)
                else:
                    settle.answer.set_exception(error)

    async def close(self) -> None:
        """Wait for the settles in flight (a client closes after them)."""
        if self._flushers:
            await asyncio.gather(*self._flushers.values(), return_exceptions=True)
