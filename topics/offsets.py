"""Reading partitions: log end offsets that are right on every
Kafka-protocol broker, taking what a consumer has without waiting longer
than needed, where a record read sits (:func:`position_of`) and where a
consumer group committed it was (:func:`committed_offsets`).

Tansu answers ListOffsets(latest) with the last batch's base offset + 1, not
the log end (after one batch of 1,000 records it says 1); the high watermark
in a fetch response is right. So the end of a partition is read from a fetch:
ListOffsets gives a lower bound, a fetch from just below it returns one small
batch and the true high watermark. On Apache Kafka both agree and this costs
one fetch, so where ListOffsets is exact (``exact=True``, the broker profile
says when) it is used alone. Tansu may also hand a consumer records past
some still being appended: :class:`GapGuard` reads those again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

#: Errors of a partition whose leader is not known yet, or is moving; the
#: epoch ones while a restarted cluster's metadata catches up ("Leader epoch
#: is newer than broker epoch": librdkafka does not mark it retriable, and a
#: client reading the entity definitions just after every broker came back
#: failed on it once, tests/test_broker_loss.py).
_LEADER_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH})
#: librdkafka's OFFSET_INVALID: no fetch response has given a watermark yet.
OFFSET_UNKNOWN = -1001
#: ListOffsets' timestamps for the log end and the log start
_LATEST = -1
_EARLIEST = -2


def take(consumer: Consumer, max_records: int, timeout: float) -> list[Message]:
    """Up to ``max_records`` records: waits at most ``timeout`` for the first,
    then takes what is already fetched. (``Consumer.consume(n, timeout)`` waits
    the whole timeout unless ``n`` records arrive, which would put a fixed delay
    on every request/reply round trip.)"""
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(num_messages=max_records - 1, timeout=0)]


def log_end_offsets(consumer: Consumer, partitions: list[tuple[str, int]], *, exact: bool,
                    timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """End offsets of ``partitions``: ListOffsets alone where it is ``exact``,
    else read from fetch responses.

    ``consumer`` must be a consumer used only for this (it is re-assigned).
    """
    deadline = time.monotonic() + timeout
    lower = {tp: listed_end(consumer, tp, deadline) for tp in partitions}
    if exact:
        return lower
    consumer.assign([TopicPartition(t, p, max(0, lower[(t, p)] - 1)) for t, p in partitions])
    ends: dict[tuple[str, int], int] = {}
    try:
        while len(ends) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - set(ends))
                raise TimeoutError(f"no fetch response for {missing} within {timeout}s")
            take(consumer, 500, 0.02)
            for tp in partitions:
                high = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
                if high != OFFSET_UNKNOWN and high >= lower[tp]:
                    ends[tp] = high
    finally:
        consumer.unassign()
    return ends


def committed_offsets(config: dict[str, Any], group: str, topic: str, partitions: list[int],
                      timeout: float) -> dict[int, int]:
    """The offsets ``group`` committed for ``partitions`` of ``topic``
    (negative: none), in one request of a client made for it: it raises
    :class:`KafkaException` or :class:`TimeoutError` within ``timeout``
    (a member's own read, aiokafka's, asks again for ever)."""
    admin = AdminClient(config)
    asked = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    future = admin.list_consumer_group_offsets([asked], request_timeout=timeout)[group]
    answer = future.result(timeout=timeout)
    found = {}
    for tp in answer.topic_partitions:
        if tp.error is not None:
            raise KafkaException(tp.error)
        found[tp.partition] = tp.offset
    return found


def listed_end(consumer: Consumer, tp: tuple[str, int], deadline: float,
               also: frozenset[int] = frozenset()) -> int:
    """ListOffsets(latest), asked again until ``deadline`` (``time.monotonic``)
    while the broker answers with a retriable error, or one of the codes
    ``also`` names: a topic created a moment ago may have no leader yet
    (Apache Kafka says "Not leader for partition" until metadata spreads),
    nor may a broker the controller fenced while it was stopped and is
    taking back (tests/test_pairing.py resumes one so).

    One request: ``offsets_for_times`` with the timestamp -1 (latest), where
    ``get_watermark_offsets`` asks for the log start too, in a request of its
    own (every new receiver reads on the entity definitions so)."""
    return _listed(consumer, tp, _LATEST, deadline, also)


def listed_start(consumer: Consumer, tp: tuple[str, int], deadline: float) -> int:
    """ListOffsets(earliest): the log start, asked as :func:`listed_end` asks."""
    return _listed(consumer, tp, _EARLIEST, deadline, frozenset())


def _listed(consumer: Consumer, tp: tuple[str, int], timestamp: int, deadline: float,
            also: frozenset[int]) -> int:
    while True:
        try:
            [listed] = consumer.offsets_for_times(
                [TopicPartition(*tp, timestamp)], timeout=max(0.1, deadline - time.monotonic()))
            if listed.error is not None:
                raise KafkaException(listed.error)
            return int(listed.offset)
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in _LEADER_MOVING
                    or error.code() in also) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def offset_of(record: Message) -> int:
    """The offset of a record read or delivered without an error.

    confluent-kafka types a ``Message``'s partition and offset as optional: a
    message that only reports an error (the end of a partition, a refused
    fetch) has neither. Every record read past its error check, or delivered
    without an error, has both."""
    offset = record.offset()
    if offset is None:
        raise ValueError(f"a record without an offset (error: {record.error()})")
    return offset


def position_of(record: Message) -> tuple[int, int]:
    """``(partition, offset)`` of a record read or delivered without an error."""
    partition = record.partition()
    if partition is None:
        raise ValueError(f"a record without a partition (error: {record.error()})")
    return partition, offset_of(record)


#: how long a gap in a partition's offsets is read again before it is taken
#: for one that holds nothing (see :class:`GapGuard`)
GAP_WAIT_S = 5.0


class GapGuard:
    """Keeps a consumer from reading past records still being appended.

    Tansu 0.6 may answer a fetch with a batch appended after one it is still
    writing, and the consumer then fetches on from after the later batch:
    the earlier records, acknowledged to their producer, are never read.
    (Seen with the engine's commands: offsets 696-697 of a partition never
    came, 698 did, four producers appending to it; their clients waited
    10 s and sent them again. Read again, such a gap filled in 25-35 ms.)
    Where the broker profile says so (``skips_unfinished_appends``), a record
    past the next offset expected is held back with every later one of its
    partition, and the partition read again from the expected offset, until
    the gap fills or ``GAP_WAIT_S`` passed: then it is taken for a gap that
    holds nothing. Elsewhere every record passes. Not thread-safe: the
    consumer's own thread calls it.
    """

    def __init__(self, topic: str, *, enabled: bool,
                 start: Sequence[TopicPartition] = ()) -> None:
        """``start``: where the consumer was assigned (:meth:`moved`)."""
        self._topic = topic
        self.enabled = enabled
        #: partition -> the next offset expected
        self._next: dict[int, int] = {}
        #: partition -> when (time.monotonic()) its gap at the expected offset was first met
        self._gaps: dict[int, float] = {}
        self.moved(start)

    def moved(self, positions: Sequence[TopicPartition]) -> None:
        """The consumer was assigned ``positions`` (real offsets), or sought
        there: read on from them."""
        for tp in positions:
            self._next[tp.partition] = tp.offset
            self._gaps.pop(tp.partition, None)

    def admit(self, consumer: Consumer, records: list[Message]) -> list[Message]:
        """Those of ``records`` (as ``consumer`` returned them) that come in
        order, errors included; the partitions of those held back are sought
        back to the first offset missing."""
        if not self.enabled:
            return records
        held: set[int] = set()
        admitted = []
        for record in records:
            if record.error() is not None:
                admitted.append(record)
                continue
            partition, offset = position_of(record)
            if partition in held:
                continue
            expected = self._next.get(partition)
            if expected is not None and offset > expected and not self._waited_out(partition):
                held.add(partition)
                # (the partition is being fetched: a record of it just came)
                consumer.seek(TopicPartition(self._topic, partition, expected))
                continue
            self._gaps.pop(partition, None)
            if expected is None or offset >= expected:  # (a repeat moves nothing back)
                self._next[partition] = offset + 1
            admitted.append(record)
        return admitted

    def _waited_out(self, partition: int) -> bool:
        now = time.monotonic()
        first = self._gaps.setdefault(partition, now)
        if now - first < GAP_WAIT_S:
            return False
        log.warning("offsets from %d of %s[%d] did not come in %.0f s: read on past them",
                    self._next[partition], self._topic, partition, GAP_WAIT_S)
        return True
