"""The offsets a window tracks, stored in bounded chunks with ordered indexes.

Every offset the window knows something about (locked, released, deferred,
dead-lettered, scheduled, cancelled) has an :class:`Entry`; an offset without
one below ``next`` is settled. Entries live in chunks of :data:`CHUNK`
consecutive offsets, one key each, so a command rewrites only the chunks it
touched, and a queue holding a million dead letters costs its commands no more
than an empty one. Sub-queues (available for redelivery, dead-lettered,
transfer dead-lettered, deferred, scheduled) have their own ordered index
chunks, so receiving from a dead-letter queue reads its first chunk instead of
walking everything; per-state counts are kept as entries change.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator
from dataclasses import dataclass

from streams.states import (
    AVAILABLE,
    DEAD,
    DEAD_LOCKED,
    DEFERRED,
    DEFERRED_LOCKED,
    SCHEDULED,
    TRANSFER_DEAD,
    TRANSFER_DEAD_LOCKED,
)
from streams.store import Txn

CHUNK = 128
#: state -> the sub-queue index it is listed in
_FAMILY = {AVAILABLE: "a", DEAD: "d", DEAD_LOCKED: "d", TRANSFER_DEAD: "t",
           TRANSFER_DEAD_LOCKED: "t", DEFERRED: "f", DEFERRED_LOCKED: "f", SCHEDULED: "s"}
#: sub-queue name -> index family
FAMILIES = {"available": "a", "deadletter": "d", "transferdeadletter": "t",
            "deferred": "f", "scheduled": "s"}


@dataclass(frozen=True, slots=True)
class Entry:
    """What the window knows of one offset. Replace, never mutate: the
    per-state counts are kept by :meth:`Entries.put`."""

    state: str
    deliveries: int = 0
    batch: int = 0            # the lock batch holding it (0: none)
    until: int = 0            # lock end; the due time of a scheduled message
    locked_at: int | None = None  # set once a lock is renewed
    reason: str | None = None
    description: str | None = None
    source: str | None = None
    session: str | None = None  # the session it belongs to (session-enabled entities)

    def encode(self) -> list[object]:
        fields = [self.state, self.deliveries, self.batch, self.until, self.locked_at,
                  self.reason, self.description, self.source, self.session]
        while fields[-1] is None:
            fields.pop()
        return fields

    @classmethod
    def decode(cls, fields: list[object]) -> Entry:
        """The entry :meth:`encode` gave ``fields`` for (read back from JSON)."""
        state, deliveries, batch, until, locked_at, reason, description, source, session = (
            fields + _DEFAULTS[len(fields):])
        return cls(_str(state), _int(deliveries), _int(batch), _int(until),
                   None if locked_at is None else _int(locked_at), _str_or_none(reason),
                   _str_or_none(description), _str_or_none(source), _str_or_none(session))


#: the fields :meth:`Entry.encode` may leave off the end, as the class defaults them
#: (the state is never left off)
_DEFAULTS: list[object] = [None, 0, 0, 0, None, None, None, None, None]


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"an entry field is {value!r}, not a number")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"an entry field is {value!r}, not a string")
    return value


def _str_or_none(value: object) -> str | None:
    return None if value is None else _str(value)


def _hex(n: int, width: int = 12) -> bytes:
    return f"{n:0{width}x}".encode()


class Entries:
    """One window's entries over a transaction."""

    def __init__(self, txn: Txn, prefix: bytes, counts: dict[str, int]) -> None:
        self._txn = txn
        self._chunk_prefix = prefix + b"c"
        self._index_prefix = prefix + b"q"
        #: state -> how many entries are in it (stored in the window's header)
        self.counts = counts
        self._chunks: dict[int, dict[int, Entry]] = {}
        self._indexes: dict[tuple[str, int], list[int]] = {}
        self._dirty_chunks: set[int] = set()
        self._dirty_indexes: set[tuple[str, int]] = set()

    # ------------------------------------------------------------ point access
    def get(self, offset: int) -> Entry | None:
        return self._chunk(offset // CHUNK).get(offset)

    def put(self, offset: int, entry: Entry | None) -> None:
        """Set (or with None, forget) the entry of ``offset``."""
        number = offset // CHUNK
        chunk = self._chunk(number)
        old = chunk.get(offset)
        if old is not None:
            self.counts[old.state] -= 1
            if not self.counts[old.state]:
                del self.counts[old.state]
        if entry is None:
            chunk.pop(offset, None)
        else:
            chunk[offset] = entry
            self.counts[entry.state] = self.counts.get(entry.state, 0) + 1
        self._dirty_chunks.add(number)
        before = _FAMILY.get(old.state) if old else None
        after = _FAMILY.get(entry.state) if entry else None
        if before != after:
            if before:
                self._index(before, number).remove(offset)
                self._dirty_indexes.add((before, number))
            if after:
                bisect.insort(self._index(after, number), offset)
                self._dirty_indexes.add((after, number))

    def count(self, *states: str) -> int:
        return sum(self.counts.get(s, 0) for s in states)

    # --------------------------------------------------------------- ordered
    def between(self, start: int, stop: int) -> Iterator[tuple[int, Entry]]:
        """Entries at offsets ``start <= offset < stop``, in order. Reads chunk
        by chunk as it goes: stop early and the rest is never read."""
        self.flush()
        chunks = self._txn.range(self._chunk_prefix + _hex(start // CHUNK),
                                 self._chunk_prefix + _hex((stop + CHUNK - 1) // CHUNK))
        for key, raw in chunks:
            chunk = self._chunk(int(key[len(self._chunk_prefix):], 16), raw)
            for offset in sorted(chunk):
                if start <= offset < stop:
                    yield offset, chunk[offset]

    def in_family(self, family: str, start: int = 0) -> Iterator[tuple[int, Entry]]:
        """Entries of one sub-queue (see :data:`FAMILIES`) from ``start`` on, in
        order, read index chunk by index chunk as it goes."""
        self.flush()
        prefix = self._index_prefix + family.encode()
        for key, _ in self._txn.range(prefix + _hex(start // CHUNK), prefix + b"~"):
            number = int(key[len(prefix):], 16)
            for offset in list(self._index(family, number)):
                entry = self.get(offset)
                if offset >= start and entry is not None:
                    yield offset, entry

    def first_offset(self) -> int | None:
        """The lowest offset that has an entry."""
        for offset, _ in self.between(0, 1 << 48):
            return offset
        return None

    # ----------------------------------------------------------------- storage
    def flush(self) -> None:
        """Write the chunks and indexes changed so far into the transaction."""
        for number in self._dirty_chunks:
            chunk = self._chunks[number]
            key = self._chunk_prefix + _hex(number)
            if chunk:
                body = {str(o): e.encode() for o, e in chunk.items()}
                self._txn.put(key, json.dumps(body, separators=(",", ":")).encode())
            else:
                self._txn.delete(key)
        for family, number in self._dirty_indexes:
            offsets = self._indexes[family, number]
            key = self._index_prefix + family.encode() + _hex(number)
            if offsets:
                self._txn.put(key, json.dumps(offsets, separators=(",", ":")).encode())
            else:
                self._txn.delete(key)
        self._dirty_chunks.clear()
        self._dirty_indexes.clear()

    def _chunk(self, number: int, raw: bytes | None = None) -> dict[int, Entry]:
        """The chunk ``number``, decoded once per command (from ``raw`` when
        the caller has just read it)."""
        chunk = self._chunks.get(number)
        if chunk is None:
            raw = raw if raw is not None else self._txn.get(self._chunk_prefix + _hex(number))
            chunk = {int(o): Entry.decode(f) for o, f in json.loads(raw).items()} if raw else {}
            self._chunks[number] = chunk
        return chunk

    def _index(self, family: str, number: int) -> list[int]:
        offsets = self._indexes.get((family, number))
        if offsets is None:
            raw = self._txn.get(self._index_prefix + family.encode() + _hex(number))
            offsets = json.loads(raw) if raw else []
            self._indexes[family, number] = offsets
        return offsets
