"""What a window must do at a given time, ordered by that time.

Lock ends, session lock ends, scheduled messages coming due and time-to-live
expiries are keys ``<due><kind><id>`` holding the offsets (or session ids)
concerned, one key per command that set them (a whole acquired batch shares
one lock end). The window finds what is due by reading the range of keys up
to now, and its next wake-up is the first key. A key may name offsets whose
state has moved on since (settled, renewed): whoever handles it checks each
entry. Settlements take their
offsets out of their lock's key, so a queue whose locks are all settled in
time gives the timer nothing to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streams.store import Txn
from topics import jsonbytes

LOCK, SCHEDULE, EXPIRY, SESSION = "L", "S", "E", "N"
_DUE_WIDTH = 13  # hex digits of a millisecond timestamp, good past the year 10000


class DueIndex:
    """One window's timers over a transaction. A key's items are parsed
    once per transaction and written back at :meth:`flush`: the settle
    commands applied together each take their offset out of the same lock
    key, which was read and written in JSON for every one of them."""

    def __init__(self, txn: Txn, prefix: bytes) -> None:
        self._txn = txn
        self._prefix = prefix + b"t"
        #: the items of the keys this transaction read or changed
        self._items: dict[bytes, list[Any]] = {}
        #: the keys whose items changed since the last flush
        self._changed: set[bytes] = set()

    def add(self, due: int, kind: str, ident: str, items: list[Any]) -> None:
        """Remember ``items`` (offsets, or ``[offset, expires]`` pairs) for ``due``."""
        if not items:
            return
        key = self._key(due, kind, ident)
        self._items[key] = (self._read(key) or []) + items
        self._changed.add(key)

    def discard(self, due: int, kind: str, ident: str, items: list[Any]) -> None:
        """Forget ``items`` of a key (locks settled before they end), and the
        key once it names nothing: the timer then has no reason to wake."""
        key = self._key(due, kind, ident)
        stored = self._read(key)
        if not stored:
            return
        if len(items) == 1 and stored.count(items[0]) == 1:
            # one settled of a batch's lock (a thread settling one by one), in
            # place: the list is this transaction's own, parsed for it
            stored.remove(items[0])
        else:
            gone = set(items)
            self._items[key] = [item for item in stored if item not in gone]
        self._changed.add(key)

    def _read(self, key: bytes) -> list[Any] | None:
        if key not in self._items:
            raw = self._txn.get(key)
            if raw is None:
                return None
            self._items[key] = jsonbytes.loads(raw)
        return self._items[key]

    def flush(self) -> None:
        """Write the changed keys to the transaction (a key left empty is deleted)."""
        for key in self._changed:
            if items := self._items[key]:
                self._txn.put(key, jsonbytes.dumps(items))
            else:
                self._txn.delete(key)
        self._changed.clear()

    def due(self, now: int) -> Iterator[tuple[bytes, str, list[Any]]]:
        """Keys due at ``now`` or before, oldest first: ``(key, kind, items)``."""
        self.flush()
        stop = self._prefix + f"{now + 1:0{_DUE_WIDTH}x}".encode()
        for key, raw in list(self._txn.range(self._prefix, stop)):
            yield key, chr(key[len(self._prefix) + _DUE_WIDTH]), jsonbytes.loads(raw)

    def _key(self, due: int, kind: str, ident: str) -> bytes:
        return self._prefix + f"{due:0{_DUE_WIDTH}x}{kind}{ident}".encode()

    def remove(self, key: bytes) -> None:
        self._items[key] = []
        self._changed.add(key)

    def next_wake(self, previous: int | None) -> int | None:
        """When the earliest timer is due after this transaction, knowing it
        was ``previous`` before: read from the store only when the
        transaction deleted the earliest key (a settlement that emptied the
        first lock's key, say), since a key's due time is in its name."""
        self.flush()
        mine = [(k, v) for k, v in self._txn.writes.items() if k.startswith(self._prefix)]
        if not mine:
            return previous
        added = [self._due_of(k) for k, v in mine if v is not None]
        if previous is not None and any(v is None and self._due_of(k) == previous
                                        for k, v in mine):
            # No key was due before ``previous`` but those added here: the
            # read starts there (RocksDB would otherwise step over every
            # timer deleted since its last compaction).
            later = self.first(previous)
            return min([*added, *([] if later is None else [later])], default=None)
        return min([*added, *([] if previous is None else [previous])], default=None)

    def _due_of(self, key: bytes) -> int:
        return int(key[len(self._prefix):len(self._prefix) + _DUE_WIDTH], 16)

    def first(self, at_least: int = 0) -> int | None:
        """When the earliest timer is due (``at_least``: none is due before)."""
        self.flush()
        found = self._txn.first(self._prefix + f"{at_least:0{_DUE_WIDTH}x}".encode(),
                                self._prefix + b"~")
        return None if found is None else self._due_of(found[0])
