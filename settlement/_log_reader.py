"""Reads granted offsets of an entity's log straight from Kafka.

The engine grants offsets; payloads never pass through it. One consumer per
log partition is assigned (never subscribed) and moved only when a grant does
not continue where it stopped, so a receiver that keeps getting the next
fresh offsets reads the log sequentially. The high watermark of the latest
fetch response tells the engine how far the log goes (ListOffsets cannot be
trusted for that on every broker; see ``topics.offsets``).
"""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from settlement.exceptions import ServiceBusCommunicationError, denied
from topics.connection import ConnectionSettings
from topics.names import entity_of_log
from topics.offsets import OFFSET_UNKNOWN, offset_of, take

_AHEAD_LIMIT = 10_000


class PartitionReader:
    """Fetches records of one partition by offset and tracks its log end.
    Thread-safe: a receiver's read-ahead reads from another thread."""

    def __init__(self, settings: ConnectionSettings, topic: str, partition: int) -> None:
        self._tp = TopicPartition(topic, partition)
        config = settings.consumer_config(f"reader-{uuid.uuid4().hex[:12]}")
        config["queued.max.messages.kbytes"] = 16384
        self._consumer = Consumer(config)
        try:
            lower = self._consumer.get_watermark_offsets(self._tp, timeout=10)[1]
        except KafkaException:
            self._raise_if_denied(self._consumer.list_topics(topic, timeout=10).topics[topic].error)
            raise
        self._position = max(0, lower - 1)
        self._consumer.assign([TopicPartition(topic, partition, self._position)])
        self._ahead: dict[int, Message] = {}
        self._hw = OFFSET_UNKNOWN
        self._lock = threading.RLock()

    def high_watermark(self, timeout: float = 5.0) -> int:
        """The log end seen in the latest fetch response (waits for the first)."""
        with self._lock:
            return self._high_watermark(timeout)

    def _high_watermark(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            self._refresh_hw()
            if self._hw != OFFSET_UNKNOWN or time.monotonic() > deadline:
                return max(self._hw, 0)
            self._take(take(self._consumer, 500, 0.02))

    def _refresh_hw(self) -> None:
        high = self._consumer.get_watermark_offsets(self._tp, cached=True)[1]
        if high != OFFSET_UNKNOWN:
            self._hw = max(self._hw, high)

    def read(self, offsets: list[int], timeout: float = 10.0) -> dict[int, Message | None]:
        """Records at ``offsets``; an offset that holds no record (a gap left by
        a transaction marker, say) maps to None."""
        with self._lock:
            return self._read(offsets, timeout)

    def _read(self, offsets: list[int], timeout: float) -> dict[int, Message | None]:
        found: dict[int, Message | None] = {}
        for o in offsets:
            if o in self._ahead:
                found[o] = self._ahead.pop(o)
        wanted = sorted(set(offsets) - set(found))
        deadline = time.monotonic() + timeout
        while wanted:
            if time.monotonic() > deadline:
                raise ServiceBusCommunicationError(
                    f"could not read offsets {wanted[:5]}... of {self._tp.topic}"
                    f"[{self._tp.partition}] within {timeout}s"
                )
            if self._position > wanted[0] or (self._position < wanted[0]
                                              and wanted[0] - self._position > 500):
                self._seek(wanted[0])
            want = set(wanted)
            for record in self._take(take(self._consumer, min(len(wanted) + 50, 5000), 0.05)):
                offset = offset_of(record)
                if offset in want:
                    found[offset] = record
                elif offset > wanted[0] and len(self._ahead) < _AHEAD_LIMIT:
                    self._ahead[offset] = record
            # Offsets passed without a record are gaps: they hold nothing.
            for o in wanted:
                if o not in found and o < self._position:
                    found[o] = None
            wanted = [o for o in wanted if o not in found]
        return found

    def _raise_if_denied(self, err: KafkaError | None) -> None:
        refused = err and denied(err.name(), "the Listen right",
                                 f"queue {entity_of_log(self._tp.topic)!r}")
        if refused:
            raise refused

    def _take(self, records: list[Message]) -> list[Message]:
        good = []
        for record in records:
            err = record.error()
            if err is not None:
                self._raise_if_denied(err)
                if err.code() != KafkaError._PARTITION_EOF:
                    raise ServiceBusCommunicationError(
                        f"reading {self._tp.topic}[{self._tp.partition}] failed: {err.str()}")
                continue
            self._position = offset_of(record) + 1
            good.append(record)
        self._refresh_hw()
        return good

    def _seek(self, offset: int) -> None:
        self._ahead.clear()
        target = TopicPartition(self._tp.topic, self._tp.partition, offset)
        try:
            self._consumer.seek(target)
        except KafkaException:  # the fetcher has not started yet: assign instead
            self._consumer.assign([target])
        self._position = offset

    def close(self) -> None:
        with self._lock:
            self._consumer.close()
