"""``size_in_bytes`` of a queue: the records of the messages still in it.

The engine tracks offsets, not bytes, so the size is read from the log: the
offsets still in play come from the engine (a peek of each sub-queue), the
record sizes from Kafka. Up to ``SAMPLE`` messages per partition are read;
beyond that the size is extrapolated from their mean, which keeps the call
bounded on deep queues (the send quota, :mod:`settlement._quota`, asks for
a smaller sample: it measures on the hot path).
"""

from __future__ import annotations

from confluent_kafka import Message

from settlement._engine_link import EngineLink
from settlement._log_reader import PartitionReader
from settlement._settled_stats import add_counts, log_ends, settled_stats
from settlement.management._runtime import QueueRuntimeProperties
from topics import names
from topics.commands import MAX_ACQUIRE, PeekArgs
from topics.connection import ConnectionSettings
from topics.entities import QueueProperties, SubscriptionProperties
from topics.message_record import stored_size

SAMPLE = 20_000
_SUB_QUEUES = ("active", "deadletter", "transferdeadletter")


Receivable = QueueProperties | SubscriptionProperties


def entity_size_in_bytes(settings: ConnectionSettings, link: EngineLink, props: Receivable,
                         *, sample: int = SAMPLE) -> int:
    """The ``size_in_bytes`` of a queue or a subscription, counts and all, as
    the send quota measures it: without waiting for a log scanner to catch
    up (the messages it has not read yet are then counted as in play)."""
    ends = log_ends(link, props)
    counts = QueueRuntimeProperties(props.path)
    add_counts(counts, settled_stats(link, props, ends, scan_wait=0.0))
    return queue_size_in_bytes(settings, link, props, ends, counts.total_message_count,
                               sample=sample)


def queue_size_in_bytes(settings: ConnectionSettings, link: EngineLink, props: Receivable,
                        ends: dict[int, int], total_messages: int, *, sample: int = SAMPLE
                        ) -> int:
    """The size of the messages still in play, from up to ``sample`` of
    them per partition (below the log ends ``ends``)."""
    if total_messages == 0:  # nothing in play: no peek needed
        return 0
    offsets_seen = 0
    sampled_bytes = 0
    topic = names.entity_log(settings.namespace, props.path)
    for partition in range(props.partition_count):
        offsets = _offsets_in_play(link, props, partition, ends[partition], sample)
        if not offsets:
            continue
        reader = PartitionReader(settings, topic, partition)
        try:
            records = reader.read(offsets)
        finally:
            reader.close()
        for record in records.values():
            if record is not None:
                sampled_bytes += _size(record)
        offsets_seen += len(offsets)
    if offsets_seen == 0:
        return 0
    return round(sampled_bytes * max(total_messages, offsets_seen) / offsets_seen)


def _offsets_in_play(link: EngineLink, props: Receivable, partition: int, hw: int,
                     sample: int) -> list[int]:
    found: list[int] = []
    page = min(sample, MAX_ACQUIRE)
    for sub in _SUB_QUEUES:
        first = 0
        while len(found) < sample:
            reply = link.call(link.command(props.path, partition,
                                           PeekArgs(sub, first, page, hw)))
            entries = reply.result.get("messages", []) if reply.ok else []
            found += [e[0] for e in entries]
            if len(entries) < page:
                break
            first = entries[-1][0] + 1
    return sorted(set(found))[:sample]


def _size(record: Message) -> int:
    key = record.key()
    return stored_size(key.encode() if isinstance(key, str) else key, record.value(),
                       record.headers())
