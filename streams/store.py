"""Ordered key-value storage for the engine's state, and a transaction over it.

The state machine reads and writes through :class:`Txn`: reads see the
transaction's own writes, and nothing reaches the store until the engine has
made the whole transaction durable (``streams.command_agent``). Keys sort
bytewise, so numbers in keys are fixed-width hex and a range read walks them
in order: that is how timers, sub-queues and the log's retained start are
found without walking every entry.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Protocol


class Store(Protocol):
    """What the state machine needs of a store: point reads and ordered ranges."""

    def get(self, key: bytes) -> bytes | None: ...

    def range(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Items with ``start <= key < stop``, in key order."""
        ...


class MemoryStore:
    """A store in a sorted list: for the state machine on its own (tests, bench)."""

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._values: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def range(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        i = bisect.bisect_left(self._keys, start)
        while i < len(self._keys) and self._keys[i] < stop:
            key = self._keys[i]
            yield key, self._values[key]
            i += 1

    def apply(self, writes: dict[bytes, bytes | None]) -> None:
        for key, value in writes.items():
            if value is None:
                if self._values.pop(key, None) is not None:
                    del self._keys[bisect.bisect_left(self._keys, key)]
            else:
                if key not in self._values:
                    bisect.insort(self._keys, key)
                self._values[key] = value

    def __len__(self) -> int:
        return len(self._keys)


class Txn:
    """Writes kept aside until committed; reads see them over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: key -> new value, or None for a deletion
        self.writes: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self.writes:
            return self.writes[key]
        return self.store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.writes[key] = value

    def delete(self, key: bytes) -> None:
        self.writes[key] = None

    def range(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The store's range merged with this transaction's writes."""
        mine = sorted(k for k in self.writes if start <= k < stop)
        theirs = self.store.range(start, stop)
        pending = next(theirs, None)
        i = 0
        while pending is not None or i < len(mine):
            if pending is None or (i < len(mine) and mine[i] <= pending[0]):
                key = mine[i]
                i += 1
                if pending is not None and pending[0] == key:
                    pending = next(theirs, None)
                value = self.writes[key]
                if value is not None:
                    yield key, value
            else:
                if pending[0] not in self.writes:
                    yield pending
                pending = next(theirs, None)

    def first(self, start: bytes, stop: bytes) -> tuple[bytes, bytes] | None:
        return next(self.range(start, stop), None)
