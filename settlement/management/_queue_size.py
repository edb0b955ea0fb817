"""``size_in_bytes`` of a queue: the records of the messages still in it.

The engine tracks offsets, not bytes, so the size is read from the log: the
offsets still in play come from the engine (a peek of each sub-queue), the
record sizes from Kafka. Up to ``SAMPLE`` messages per partition are read;
beyond that the size is extrapolated from their mean, which keeps the call
bounded on deep queues.
"""

from __future__ import annotations

from confluent_kafka import Message

from settlement._engine_link import EngineLink
from settlement._log_reader import PartitionReader
from settlement._properties import QueueProperties
from settlement._topic_properties import SubscriptionProperties
from topics import names
from topics.commands import MAX_ACQUIRE
from topics.connection import ConnectionSettings

SAMPLE = 20_000
_SUB_QUEUES = ("active", "deadletter", "transferdeadletter")


Receivable = QueueProperties | SubscriptionProperties


def queue_size_in_bytes(settings: ConnectionSettings, link: EngineLink, props: Receivable,
                        ends: dict[int, int], total_messages: int) -> int:
    offsets_seen = 0
    sampled_bytes = 0
    topic = names.entity_log(settings.namespace, props.path)
    for partition in range(props.partition_count):
        offsets = _offsets_in_play(link, props, partition, ends[partition])
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


def _offsets_in_play(link: EngineLink, props: Receivable, partition: int, hw: int
                     ) -> list[int]:
    found: list[int] = []
    for sub in _SUB_QUEUES:
        first = 0
        while len(found) < SAMPLE:
            reply = link.call(link.command("peek", props.path, partition, sub=sub,
                                           max=MAX_ACQUIRE, hw=hw, **{"from": first}))
            entries = reply.result.get("messages", []) if reply.ok else []
            found += [e[0] for e in entries]
            if len(entries) < MAX_ACQUIRE:
                break
            first = entries[-1][0] + 1
    return sorted(set(found))[:SAMPLE]


def _size(record: Message) -> int:
    headers = record.headers() or []
    return (len(record.key() or b"") + len(record.value() or b"")
            + sum(len(k) + len(v or b"") for k, v in headers))
