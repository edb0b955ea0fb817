"""Where a record sits in its log.

confluent-kafka types a ``Message``'s partition and offset as optional: a
message that only reports an error (the end of a partition, a refused fetch)
has neither. Every record the client library reads past its error check, or
gets back from a delivery report without an error, has both.
"""

from __future__ import annotations

from confluent_kafka import Message


def offset_of(record: Message) -> int:
    """The offset of a record read or delivered without an error."""
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
