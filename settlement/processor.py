"""A message processor: a handler run with bounded concurrency, settled in batches.

The SDK settles one message per call; at high rates that is one engine round
trip per message. Here handlers run on a thread pool, their outcomes queue up
and are settled together (one command per partition): completed when the
handler returns, abandoned when it raises. A handler may also settle its
message itself (complete, abandon, dead-letter, defer): the processor then
leaves it alone, and the concurrent calls of the handlers share engine
commands (see ``settlement._settle_batcher``). Every message still gets its
own answer; lost locks are counted and logged per message.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from settlement.message import ServiceBusReceivedMessage

log = logging.getLogger(__name__)


class Settled(Protocol):
    """The answer for one message of a batch settlement."""

    @property
    def message(self) -> ServiceBusReceivedMessage: ...

    @property
    def error(self) -> Exception | None: ...


class Source(Protocol):
    """What a processor needs of its receiver (a :class:`settlement.ServiceBusReceiver`):
    a protocol, as the receiver module makes processors."""

    def receive_messages(self, max_message_count: int | None = 1,
                         max_wait_time: float | None = None) -> list[ServiceBusReceivedMessage]:
        ...

    def settle_messages(self, messages: list[ServiceBusReceivedMessage], action: str
                        ) -> Sequence[Settled]: ...


class MessageProcessor:
    def __init__(self, receiver: Source,
                 handler: Callable[[ServiceBusReceivedMessage], Any], *,
                 max_concurrent_calls: int, batch_size: int, max_wait_time: float | None,
                 max_message_count: int | None) -> None:
        if max_concurrent_calls < 1:
            raise ValueError("max_concurrent_calls must be at least 1")
        self._receiver = receiver
        self._handler = handler
        self._concurrency = max_concurrent_calls
        self._batch = max(batch_size, 1)
        self._max_wait = max_wait_time
        self._limit = max_message_count
        self._lock = threading.Lock()
        self._done: dict[str, list[ServiceBusReceivedMessage]] = {"complete": [], "abandon": []}
        self._running = 0
        self.stats = {"received": 0, "completed": 0, "abandoned": 0, "lock_lost": 0,
                      "settled_by_handler": 0}

    def run(self) -> dict[str, int]:
        """Process until no message arrives for ``max_wait_time`` and no handler
        is still running (abandoned messages come back and are processed too),
        or until ``max_message_count`` messages were received."""
        # The handlers' threads take messages from a queue, and a message
        # takes a slot (a token) before it is queued: at most this many are
        # received and not handled. (A thread pool made a Future, and a
        # semaphore a condition, for each message: 10-20 us of the
        # interpreter a message, which 32 callers share; py-spy --gil.)
        slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(self._concurrency + self._batch):
            slots.put(None)
        work: queue.SimpleQueue[ServiceBusReceivedMessage | None] = queue.SimpleQueue()
        threads = [threading.Thread(target=self._handle, args=(work, slots),
                                    name=f"handler-{i}", daemon=True)
                   for i in range(self._concurrency)]
        for thread in threads:
            thread.start()
        try:
            while self._limit is None or self.stats["received"] < self._limit:
                busy = self._running > 0
                want = self._batch if self._limit is None else min(
                    self._batch, self._limit - self.stats["received"])
                messages = self._receiver.receive_messages(
                    want, 0.05 if busy else self._max_wait)
                for message in messages:
                    slots.get()
                    with self._lock:
                        self._running += 1
                    work.put(message)
                self.stats["received"] += len(messages)
                self._flush()
                if not messages and not busy and not self._pending():
                    break
        finally:  # the handlers finish what was queued, then stop
            for _ in threads:
                work.put(None)
            for thread in threads:
                thread.join()
        self._flush()
        return dict(self.stats)

    def _handle(self, work: queue.SimpleQueue[ServiceBusReceivedMessage | None],
                slots: queue.SimpleQueue[None]) -> None:
        """A handler thread: run the handler on each message queued, until None."""
        while (message := work.get()) is not None:
            self._run_one(message, slots)

    def _run_one(self, message: ServiceBusReceivedMessage, slots: queue.SimpleQueue[None]
                 ) -> None:
        outcome = "abandon"
        try:
            self._handler(message)
            outcome = "complete"
        except Exception:
            log.exception("handler failed on message %s; abandoning it", message.sequence_number)
        finally:  # whatever the handler raised, its slot comes back
            with self._lock:
                if message._settled:
                    self.stats["settled_by_handler"] += 1
                else:
                    self._done[outcome].append(message)
                self._running -= 1
            slots.put(None)

    def _pending(self) -> bool:
        with self._lock:
            return any(self._done.values())

    def _flush(self) -> None:
        """Settle every finished message: one command per action and partition."""
        with self._lock:
            ready = {k: v for k, v in self._done.items() if v}
            for k in ready:
                self._done[k] = []
        for action, messages in ready.items():
            for result in self._receiver.settle_messages(messages, action):
                if result.error is None:
                    self.stats["completed" if action == "complete" else "abandoned"] += 1
                else:
                    self.stats["lock_lost"] += 1
                    log.warning("%s of message %s failed: %s", action,
                                result.message.sequence_number, result.error)
