"""Sequence numbers: ``partition << 40 | offset``, so a number names its record."""

from __future__ import annotations

OFFSET_BITS = 40
_OFFSET_MASK = (1 << OFFSET_BITS) - 1


def sequence_number(partition: int, offset: int) -> int:
    return (partition << OFFSET_BITS) | offset


def split_sequence_number(seq: int) -> tuple[int, int]:
    if not isinstance(seq, int) or seq < 0:
        raise ValueError(f"sequence number must be a non-negative integer, got {seq!r}")
    return seq >> OFFSET_BITS, seq & _OFFSET_MASK
