"""Which partition a record goes to, as every process computes it: a
command to its window's engine partition, a session's messages to theirs.

Apart from the command format so that the engine's state machine, which
reads commands, does not load the Kafka client for its hash function."""

from __future__ import annotations

import zlib

from confluent_kafka.cimpl import murmur2


def command_partition(window_key: str, partitions: int) -> int:
    """The commands-topic partition of a window; clients and engine agree on it."""
    return zlib.crc32(window_key.encode()) % partitions


def session_partition(session_id: str, partitions: int) -> int:
    """The partition a session's messages are in: Kafka's murmur2 partitioner
    on the session id, the key senders give them (as Java clients do by
    default, and confluent-kafka with ``partitioner=murmur2_random``)."""
    return int(murmur2(session_id.encode(), partitions)) if partitions > 1 else 0
