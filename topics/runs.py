"""Offsets as runs: a flat list ``[first, end, first, end, ...]`` of
``[first, end)`` ranges in increasing order.

One format wherever many offsets travel or are kept together: what a
subscription's rules leave out (the scanner's accepts, the ``filtered``
event's ``ranges``, a window's left-out ranges and blocks) and a session's
queued offsets in a chunk of entries. Ten subscriptions that each select a
tenth of a topic leave out nine offsets in ten: listed one by one, their
JSON (in the engine's commit records, then again on the events topic) was a
tenth of the engine's Python time while the topic was published; as runs
they are two numbers per selected message.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


def as_runs(offsets: Iterable[int]) -> list[int]:
    """``offsets``, in increasing order, as flat runs."""
    flat: list[int] = []
    for offset in offsets:
        if flat and flat[-1] == offset:
            flat[-1] = offset + 1
        else:
            flat += (offset, offset + 1)
    return flat


def run_pairs(runs: Sequence[int]) -> Iterator[tuple[int, int]]:
    """``(first, end)`` of each run."""
    return zip(runs[::2], runs[1::2], strict=True)


def run_total(runs: Sequence[int]) -> int:
    """How many offsets ``runs`` hold."""
    return sum(runs[1::2]) - sum(runs[::2])


def run_offsets(runs: Sequence[int]) -> Iterator[int]:
    """Every offset of ``runs``, in order."""
    return (offset for first, end in run_pairs(runs) for offset in range(first, end))
