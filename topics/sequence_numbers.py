"""Sequence numbers: ``(partition << 40 | offset) + 1``, so a number names its
record and, as in Service Bus, the first message of an entity is number 1
(code ported from the SDK tests ``if message.sequence_number:``)."""

from __future__ import annotations

OFFSET_BITS = 40
_OFFSET_MASK = (1 << OFFSET_BITS) - 1


def sequence_number(partition: int, offset: int) -> int:
    return ((partition << OFFSET_BITS) | offset) + 1


def split_sequence_number(seq: int) -> tuple[int, int]:
    """``(partition, offset)`` of the record that ``seq`` names."""
    if not isinstance(seq, int) or seq < 1:
        raise ValueError(f"sequence number must be a positive integer (they start at 1), "
                         f"got {seq!r}")
    return (seq - 1) >> OFFSET_BITS, (seq - 1) & _OFFSET_MASK
