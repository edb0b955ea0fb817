"""Where a record read from a log sits in it.

confluent-kafka types a ``Message``'s partition and offset as optional: a
message that only reports an error (the end of a partition, a refused fetch)
has neither. Every record the engine reads past its error check has both.
"""

from __future__ import annotations

from confluent_kafka import Message


def offset_of(record: Message) -> int:
    """The offset of a record read without an error."""
    offset = record.offset()
    if offset is None:
        raise ValueError(f"a record without an offset (error: {record.error()})")
    return offset


def partition_of(record: Message) -> int:
    """The partition of a record read without an error."""
    partition = record.partition()
    if partition is None:
        raise ValueError(f"a record without a partition (error: {record.error()})")
    return partition
