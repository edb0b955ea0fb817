"""Offsets a window never hands out, past the ranges its header keeps.

A subscription's rules leave out every offset they do not select: a run of a
million costs one ``[first, end)`` range in the window's header (at most
``window.MAX_LEFT_OUT_RANGES``). Rules that select one message in ten leave
out a range per selected message, so once the header's ranges are full the
next ones are kept here, in blocks of up to :data:`RANGES_PER_BLOCK` ranges
under a key each (``<prefix>l<first offset of the block, hex>``), in offset
order. Only the last block grows, and a block is deleted once ``next`` has
passed it: ten filtered subscriptions of one topic write a few kilobytes per
thousand messages scanned, not a cancelled entry per offset (which were the
bound of their drain: 0.2 of a plain queue's rate).
"""

from __future__ import annotations

from collections.abc import Iterator

from streams.store import Txn
from topics import jsonbytes
from topics.runs import run_pairs

#: ranges one block key holds (a few kilobytes of JSON)
RANGES_PER_BLOCK = 256


class LeftOutBlocks:
    """The blocks of one window over a transaction. The window keeps how many
    offsets they hold at or after ``next`` and where the last block starts."""

    def __init__(self, txn: Txn, prefix: bytes) -> None:
        self._txn = txn
        self._prefix = prefix + b"l"
        #: block (its key's offset) -> its ranges as read or written by this
        #: command, flat as stored (``[first, end, first, end, ...]``): an
        #: accept of a filtered subscription reads and writes its last block,
        #: and making pairs of it and flattening them again took a fifth of
        #: the engine's CPU while a topic was published
        self._blocks: dict[int, list[int]] = {}
        self._dirty: set[int] = set()

    def _key(self, block: int) -> bytes:
        return self._prefix + f"{block:012x}".encode()

    def _block(self, block: int, raw: bytes | None = None) -> list[int]:
        if block not in self._blocks:
            raw = raw if raw is not None else self._txn.get(self._key(block))
            self._blocks[block] = jsonbytes.loads(raw) if raw else []
        return self._blocks[block]

    def flush(self) -> None:
        """Write the blocks this command changed (once each, at its end)."""
        for block in self._dirty:
            self._txn.put(self._key(block), jsonbytes.dumps(self._blocks[block]))
        self._dirty.clear()

    def extend(self, runs: list[int], tail: int) -> int:
        """Leave out the flat ``[first, end)`` ``runs``; they come after every
        offset left out before, and ``tail`` is where the last block starts
        (-1: none). Returns where the last block starts now."""
        bounds = self._block(tail) if tail >= 0 else []
        if bounds and runs and bounds[-1] == runs[0]:
            bounds[-1] = runs[1]
            runs = runs[2:]
            self._dirty.add(tail)
        while runs:
            if tail < 0 or len(bounds) >= 2 * RANGES_PER_BLOCK:
                tail = runs[0]
                bounds = self._blocks[tail] = []
            room = 2 * RANGES_PER_BLOCK - len(bounds)
            bounds += runs[:room]
            runs = runs[room:]
            self._dirty.add(tail)
        return tail

    def ranges(self) -> Iterator[tuple[int, int]]:
        """Every range ``(first, end)`` the blocks hold, in order (those
        before ``next`` are gone with their block, or skipped by the caller)."""
        for key, raw in self._txn.range(self._prefix, self._prefix + b"~"):
            bounds = self._block(int(key[len(self._prefix):], 16), raw)
            yield from run_pairs(bounds)

    def pass_to(self, before: int, now: int) -> int:
        """``next`` moved from ``before`` to ``now`` (never inside a range):
        delete the blocks wholly behind it; returns how many left-out offsets
        it passed."""
        passed = 0
        for key, raw in list(self._txn.range(self._prefix, self._prefix + b"~")):
            block = int(key[len(self._prefix):], 16)
            bounds = self._block(block, raw)
            passed += sum(end - first for first, end in run_pairs(bounds)
                          if before <= first and end <= now)
            if bounds[-1] > now:
                break
            self._txn.delete(key)
            del self._blocks[block]
            self._dirty.discard(block)
        return passed

