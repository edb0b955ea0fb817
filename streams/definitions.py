"""The queues' policies as the engine knows them: read from their definitions.

Lock duration, max delivery count, time to live, duplicate detection and
forwarding live with each queue's definition on the namespace's compacted
entities topic. Every worker follows that topic from its start in a thread of
its own (it is small, one record per queue), so ``update_queue`` takes effect
without a restart and no client can reset a policy with what it cached. A
policy's version is the offset of its definition record: a window adopts a
policy only if it is newer than the one it has.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from settlement._properties import QueueProperties
from topics import names
from topics.commands import Policy
from topics.connection import ConnectionSettings
from topics.offsets import take

log = logging.getLogger(__name__)
#: How long a command for a queue the engine has not heard of waits for its
#: definition (the queue was created a moment ago).
WAIT_FOR_NEW_QUEUE_S = 2.0


class Definitions:
    """Follows the entities topic; ``policy(name)`` is the newest policy read."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._topic = names.entities(settings.namespace)
        self._consumer = Consumer({**settings.consumer_config(f"definitions-{uuid.uuid4().hex}"),
                                   "fetch.wait.max.ms": 20})
        self._consumer.assign([TopicPartition(self._topic, 0, 0)])
        self._policies: dict[str, tuple[int, Policy]] = {}
        #: name -> offset of the last deletion read: windows of an older
        #: definition belong to a deleted queue
        self._deleted: dict[str, int] = {}
        #: the next offset to read
        self._position = 0
        #: wall-clock ms when a read last found nothing more to read
        self._caught_up_ms = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="definitions", daemon=True)
        self._thread.start()

    def policy(self, name: str) -> tuple[int, Policy] | None:
        """``(version, policy)`` of a queue, None if no definition was read."""
        return self._policies.get(name)

    def deleted_at(self, name: str) -> int:
        """The offset of the queue's last deletion read, -1 if none."""
        return self._deleted.get(name, -1)

    async def read_up_to(self, offset: int) -> None:
        """Wait (briefly) until the record at ``offset`` has been read: the
        administration client names the definition it just wrote."""
        deadline = time.monotonic() + WAIT_FOR_NEW_QUEUE_S
        while self._position <= offset and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def policy_as_of(self, name: str, sent_ms: int) -> tuple[int, Policy] | None:
        """The queue's policy, waiting (briefly) for a definition written
        before ``sent_ms`` that this worker has not read yet."""
        deadline = time.monotonic() + WAIT_FOR_NEW_QUEUE_S
        while (found := self._policies.get(name)) is None and (
                self._caught_up_ms < sent_ms and time.monotonic() < deadline):
            await asyncio.sleep(0.005)
        return found

    def _follow(self) -> None:
        while not self._closed.is_set():
            started = int(time.time() * 1000)
            records = take(self._consumer, 500, 0.1)
            for record in records:
                if record.error():
                    continue
                self._apply(record.key(), record.value(), record.offset())
                self._position = record.offset() + 1
            if not records:
                self._caught_up_ms = started

    def _apply(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        name = (key or b"").decode(errors="replace")
        if value is None:
            self._policies.pop(name, None)
            self._deleted[name] = offset
            return
        try:
            self._policies[name] = (offset, QueueProperties.from_json(value).policy())
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable definition of %r at offset %d: %s",
                        name, offset, exc)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._consumer.close()
