"""The engine's records to Kafka, straight to its producer, in the order sent.

Faust sends a table's changelog records (``send_changelog``) and a topic's
records (``Topic.send``) along its own path: a buffer drained one record per
turn of the event loop, with a message object, callbacks and sensors for each.
Behind that buffer a commit record waited for the follow-up records of the
commands before it: 13 of them and 8 ms at the median, with eight threads
settling one message at a time (a third of each command's time in the engine).

Here each record goes to the producer as soon as those sent before it have,
in the order given (a key's later value must never overtake its earlier one
in a compacted topic), and its future resolves once Kafka acknowledged it.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from typing import Any

from faust.types import AppT


class RecordSender:
    """Sends records through a Faust app's producer, in order."""

    def __init__(self, app: AppT) -> None:
        self._app = app
        self._queue: deque[tuple[str, bytes | None, bytes | None, int | None,
                                 asyncio.Future[Any]]] = deque()
        self._drainer: asyncio.Future[None] | None = None

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             partition: int | None = None) -> asyncio.Future[Any]:
        """Queue a record (``value`` None: a tombstone); the future resolves
        to its ``RecordMetadata`` once Kafka acknowledged it (``partition``
        None: the producer's partitioner picks one by key)."""
        acked: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((topic, key, value, partition, acked))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return acked

    async def _drain(self) -> None:
        """Hand every queued record to the producer, oldest first. A record
        the producer refuses fails its own future; the next ones still go."""
        while self._queue:
            topic, key, value, partition, acked = self._queue.popleft()
            try:
                sent = await self._app.producer.send(topic, key, value, partition, None, None)
            except Exception as exc:  # noqa: BLE001 (its sender gets it, through the future)
                if not acked.done():
                    acked.set_exception(exc)
                continue
            # aiokafka's future (ensure_future returns a future as it is)
            asyncio.ensure_future(sent).add_done_callback(functools.partial(_pass_on, acked))


def _pass_on(acked: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    """Give the producer's outcome to the future the sender returned."""
    if acked.done():
        return
    if done.cancelled():
        acked.cancel()
    elif done.exception() is not None:
        acked.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        acked.set_result(done.result())
