"""The offsets a window tracks, stored in bounded chunks with ordered indexes.

Every offset the window knows something about (locked, released, deferred,
dead-lettered, scheduled, cancelled) has an :class:`Entry`; an offset without
one below ``next`` is settled. Entries live in chunks of :data:`CHUNK`
consecutive offsets (more where a subscription's rules leave most out:
:class:`Entries`), one key each, so a command rewrites only the chunks it
touched, and a queue holding a million dead letters costs its commands no more
than an empty one. (A session message waiting in its session is an entry to
the code, but its chunk stores it in a run of its session's queued offsets:
:class:`_Chunk`.) Sub-queues (available for redelivery, dead-lettered,
transfer dead-lettered, deferred, scheduled) have their own ordered index
chunks, so receiving from a dead-letter queue reads its first chunk instead of
walking everything; per-state counts are kept as entries change.

Long dead-letter texts (reason and description) are kept apart, under a key
of their own per offset, so that a chunk stays a few kilobytes however many
dead letters it holds: a command that settles one message rewrites its
chunk, and a chunk holding a hundred dead letters with 4 KB descriptions
would pass what one commit record may carry (docs/settlement-by-log.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import replace

from streams.states import (
    AVAILABLE,
    DEAD,
    DEAD_LOCKED,
    DEFERRED,
    DEFERRED_LOCKED,
    QUEUED,
    SCHEDULED,
    TRANSFER_DEAD,
    TRANSFER_DEAD_LOCKED,
)
from streams.store import Txn
from topics import jsonbytes
from topics.immutable import immutable
from topics.runs import as_runs, run_offsets

CHUNK = 128
#: most times :data:`CHUNK` a window's chunks may span (:meth:`Entries.__init__`)
MAX_SPREAD = 8


class Unread:
    """The type of :data:`UNREAD`."""


#: an entry not read yet (None is an offset without one)
UNREAD = Unread()
#: dead-letter texts longer than this (reason and description together) are
#: kept apart from their chunk
TEXTS_INLINE = 256
#: state -> the sub-queue index it is listed in
_FAMILY = {AVAILABLE: "a", DEAD: "d", DEAD_LOCKED: "d", TRANSFER_DEAD: "t",
           TRANSFER_DEAD_LOCKED: "t", DEFERRED: "f", DEFERRED_LOCKED: "f", SCHEDULED: "s"}
#: sub-queue name -> index family
FAMILIES = {"available": "a", "deadletter": "d", "transferdeadletter": "t",
            "deferred": "f", "scheduled": "s"}


@immutable
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


def _texts_size(entry: Entry) -> int:
    if entry.reason is None and entry.description is None:
        return 0
    return len(entry.reason or "") + len(entry.description or "")


def _hex(n: int, width: int = 12) -> bytes:
    return f"{n:0{width}x}".encode()


class Entries:
    """One window's entries over a transaction."""

    def __init__(self, txn: Txn, prefix: bytes, counts: dict[str, int],
                 span: int = CHUNK) -> None:
        """``span``: the offsets one chunk holds, :data:`CHUNK` times a power
        of two up to :data:`MAX_SPREAD`: a subscription whose rules select
        one message in ten has its entries ten offsets apart, and in chunks
        of 128 offsets each acquire and settlement of 1,000 read and wrote
        78 chunks instead of 8 (12.6 ms a settlement of 1,000 against 6.1 for
        a queue; 6.9 in chunks of 1,024). Dead-letter texts kept inline are
        shorter by as much, so that a chunk stays as small."""
        self._span = span
        self._texts_inline = TEXTS_INLINE * CHUNK // span
        self._txn = txn
        self._chunk_prefix = prefix + b"c"
        self._index_prefix = prefix + b"q"
        self._texts_prefix = prefix + b"x"
        #: state -> how many entries are in it (stored in the window's header)
        self.counts = counts
        self._chunks: dict[int, _Chunk] = {}
        self._indexes: dict[tuple[str, int], list[int]] = {}
        self._dirty_chunks: set[int] = set()
        self._dirty_indexes: set[tuple[str, int]] = set()

    # ------------------------------------------------------------ point access
    def get(self, offset: int) -> Entry | None:
        return self._read(self._chunk(offset // self._span), offset)

    def _read(self, chunk: _Chunk, offset: int) -> Entry | None:
        """The entry of ``offset`` in ``chunk``, its texts read back if apart."""
        entry = chunk.get(offset)
        if entry is not None and chunk.apart(offset):
            raw = self._txn.get(self._texts_prefix + _hex(offset))
            reason, description = jsonbytes.loads(raw) if raw else (None, None)
            entry = chunk.restore(offset, replace(entry, reason=reason, description=description))
        return entry

    def put(self, offset: int, entry: Entry | None, old: Entry | None | Unread = UNREAD
            ) -> None:
        """Set (or with None, forget) the entry of ``offset``; ``old``: its
        entry until now, if the caller has just read it (:meth:`get`): an
        acquire and a settlement of 1,000 read each entry once, not twice
        (a sixth of the window's time with them)."""
        number = offset // self._span
        chunk = self._chunk(number)
        if isinstance(old, Unread):
            old = self._read(chunk, offset)
        if old is not None:
            self.counts[old.state] -= 1
            if not self.counts[old.state]:
                del self.counts[old.state]
        apart = entry is not None and _texts_size(entry) > self._texts_inline
        was_apart = old is not None and chunk.apart(offset)
        if apart and entry is not None and (
                not was_apart or old is None
                or (old.reason, old.description) != (entry.reason, entry.description)):
            self._txn.put(self._texts_prefix + _hex(offset),
                          jsonbytes.dumps([entry.reason, entry.description]))
        elif was_apart and not apart:
            self._txn.delete(self._texts_prefix + _hex(offset))
        chunk.set(offset, entry, apart=apart)
        if entry is not None:
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
        by chunk as it goes: stop early and the rest is never read. Chunks
        this command has read already come first, without a store scan."""
        self.flush()
        number = start // self._span
        while number in self._chunks and number * self._span < stop:
            yield from self._in_chunk(self._chunks[number], start, stop)
            number += 1
        if number * self._span >= stop:
            return
        chunks = self._txn.range(self._chunk_prefix + _hex(number),
                                 self._chunk_prefix + _hex((stop + self._span - 1) // self._span))
        for key, raw in chunks:
            chunk = self._chunk(int(key[len(self._chunk_prefix):], 16), raw)
            yield from self._in_chunk(chunk, start, stop)

    def _in_chunk(self, chunk: _Chunk, start: int, stop: int) -> Iterator[tuple[int, Entry]]:
        for offset in chunk.offsets():
            if start <= offset < stop and (entry := self._read(chunk, offset)) is not None:
                yield offset, entry

    def in_family(self, family: str, start: int = 0) -> Iterator[tuple[int, Entry]]:
        """Entries of one sub-queue (see :data:`FAMILIES`) from ``start`` on, in
        order, read index chunk by index chunk as it goes."""
        self.flush()
        prefix = self._index_prefix + family.encode()
        for key, _ in self._txn.range(prefix + _hex(start // self._span), prefix + b"~"):
            number = int(key[len(prefix):], 16)
            for offset in list(self._index(family, number)):
                entry = self.get(offset)
                if offset >= start and entry is not None:
                    yield offset, entry

    def first_offset(self, at_least: int = 0) -> int | None:
        """The lowest offset that has an entry; ``at_least``: none is below it."""
        self.flush()
        # The chunk of ``at_least`` first, by its key: it is the one a command
        # settling the oldest messages has just read, and a range read of
        # RocksDB (an iterator, a seek) cost the engine 10-13 % of its main
        # thread while one thread completed messages one by one.
        offsets = self._chunk(at_least // self._span).offsets()
        if offsets:
            return offsets[0]
        found = self._txn.first(self._chunk_prefix + _hex(at_least // self._span + 1),
                                self._chunk_prefix + b"~")
        if found is None:
            return None
        return self._chunk(int(found[0][len(self._chunk_prefix):], 16), found[1]).offsets()[0]

    # ----------------------------------------------------------------- storage
    def flush(self) -> None:
        """Write the chunks and indexes changed so far into the transaction."""
        for number in self._dirty_chunks:
            key = self._chunk_prefix + _hex(number)
            raw = self._chunks[number].encode()
            if raw is not None:
                self._txn.put(key, raw)
            else:
                self._txn.delete(key)
        for family, number in self._dirty_indexes:
            offsets = self._indexes[family, number]
            key = self._index_prefix + family.encode() + _hex(number)
            if offsets:
                self._txn.put(key, jsonbytes.dumps(offsets))
            else:
                self._txn.delete(key)
        self._dirty_chunks.clear()
        self._dirty_indexes.clear()

    def _chunk(self, number: int, raw: bytes | None = None) -> _Chunk:
        """The chunk ``number``, read once per command (from ``raw`` when the
        caller has just read it)."""
        chunk = self._chunks.get(number)
        if chunk is None:
            key = self._chunk_prefix + _hex(number)
            raw = raw if raw is not None else self._txn.get(key)
            chunk = _Chunk.read(key, raw)
            self._chunks[number] = chunk
        return chunk

    def _index(self, family: str, number: int) -> list[int]:
        offsets = self._indexes.get((family, number))
        if offsets is None:
            raw = self._txn.get(self._index_prefix + family.encode() + _hex(number))
            offsets = jsonbytes.loads(raw) if raw else []
            self._indexes[family, number] = offsets
        return offsets


#: a chunk's fields of an entry whose texts are apart: the nine of
#: :meth:`Entry.encode`, then a marker
_APART_AT = 9
#: a chunk's key (not an offset) of its queued session messages
_QUEUED = "q"


def _plainly_queued(entry: Entry) -> bool:
    """A session message waiting for its first delivery, known by nothing
    but its session: kept in its chunk's runs, not as an entry of its own."""
    return (entry.state == QUEUED and entry.session is not None
            and entry == Entry(QUEUED, session=entry.session))


class _Chunk:
    """The entries of a window's span of consecutive offsets, as stored: a JSON
    object of offset -> :meth:`Entry.encode` fields. An entry is decoded only
    when read, and an unchanged one is written back as it was read, so a
    command that settles one message pays for that one entry, not for the
    whole chunk: a chunk written again is put together from each entry's
    JSON, kept from when it was last written (dumping a chunk of 128 entries
    took 70 µs, and a session's settlement rewrote the ten chunks its
    messages lie in; joining the kept pieces takes 15). A chunk written for
    the first time, mostly new (a receive locking a thousand), is dumped
    whole: that is three times cheaper per entry than a piece each.

    Queued session messages (the most a session queue holds: everything its
    receivers have not reached) have no entry each: the chunk keeps, under
    ``"q"``, each session's queued offsets as runs, so a session of 100,000
    waiting messages costs its chunks a few bytes each, not 47 a message."""

    #: chunk key -> the stored chunk and its parsed fields, the JSON of those
    #: entries whose JSON is known, whether it was dumped whole, its queued offsets per session
    #: with the JSON of each and of them all, the entries decoded, and each
    #: queued offset's session where it was looked up (made again by every
    #: command that set an entry of the chunk, that took a session's lock 5 %
    #: of the engine's time, make bench-sessions), for the chunks read or
    #: written last: the next command on a window reads back what the one
    #: before wrote. A chunk read from here shares these dicts until it first
    #: changes (:meth:`_own`); what a reader adds to them (an entry decoded,
    #: a piece of JSON) holds for the stored chunk as much as for it.
    _parsed: dict[bytes, tuple[bytes, _Parsed]] = {}
    _PARSED_MAX = 512

    def __init__(self, key: bytes, parsed: _Parsed, *, shared: bool) -> None:
        #: where the chunk is stored (the parsed cache's key)
        self._key = key
        fields, pieces, dumped_whole, queued, queued_pieces, queued_body, entries, queued_at = \
            parsed
        self._fields = fields
        #: offset -> ``"offset":`` and the JSON of its fields, where known
        self._pieces = pieces
        #: it was last written whole: written again, it is worth its pieces
        self._dumped_whole = dumped_whole
        #: session -> its queued offsets here, sorted (tuples: replaced
        #: rather than changed)
        self._queued = queued
        #: session -> the JSON of its runs, where known
        self._queued_pieces = queued_pieces
        #: the JSON of every session's runs, while none changed
        self._queued_body = queued_body
        #: queued offset -> its session, made when first asked (:meth:`_sessions`)
        self._queued_at = queued_at
        #: offset -> its entry, decoded (entries are immutable)
        self._entries = entries
        self._sorted: list[int] | None = None
        #: the dicts are the parsed cache's: copied before the first change
        self._shared = shared

    @classmethod
    def read(cls, key: bytes, raw: bytes | None) -> _Chunk:
        """The chunk stored under ``key`` as ``raw`` (None: no chunk yet)."""
        if not raw:
            return cls(key, ({}, {}, False, {}, {}, None, {}, None), shared=False)
        # Looked up by key, then compared: a chunk is several KB, and hashing
        # each one read from RocksDB and each one written cost 2.6 us of the
        # 19 a session's message paid per chunk (bytes compare at memcmp speed).
        known = cls._parsed.pop(key, None)  # and back, as the newest
        if known is not None and known[0] == raw:
            cached = known[1]
        else:
            fields = jsonbytes.loads(raw)
            runs = fields.pop(_QUEUED, {})
            queued = {session: tuple(run_offsets(r))
                      for session, r in runs.items()}
            cached = (fields, {}, False, queued, {}, None, {}, None)
        cls._remember(key, raw, cached)
        return cls(key, cached, shared=True)

    @classmethod
    def _remember(cls, key: bytes, raw: bytes, parsed: _Parsed) -> None:
        """Keep the last ``_PARSED_MAX`` chunks seen (the oldest go first)."""
        cls._parsed[key] = (raw, parsed)
        if len(cls._parsed) > cls._PARSED_MAX:
            del cls._parsed[next(iter(cls._parsed))]

    def _own(self) -> None:
        """Copy the dicts shared with the parsed cache, before changing them
        (copying every chunk as it was read and again as it was written
        was a third of writing one)."""
        if self._shared:
            self._fields = dict(self._fields)
            self._pieces = dict(self._pieces)
            self._queued = dict(self._queued)
            self._queued_pieces = dict(self._queued_pieces)
            self._entries = dict(self._entries)
            if self._queued_at is not None:
                self._queued_at = dict(self._queued_at)
            self._shared = False

    def get(self, offset: int) -> Entry | None:
        """The entry of ``offset``; without its texts if they are apart."""
        entry = self._entries.get(offset)
        if entry is None:
            fields = self._fields.get(str(offset))
            if fields is not None:
                entry = Entry.decode(fields[:_APART_AT])
            elif (session := self._sessions().get(offset)) is not None:
                entry = Entry(QUEUED, session=session)
            else:
                return None
            self._entries[offset] = entry
        return entry

    def _sessions(self) -> dict[int, str]:
        """Queued offset -> its session (made when first asked)."""
        if self._queued_at is None:
            # the chunk's own even when shared: made from the same queued offsets
            self._queued_at = {o: session for session, offsets in self._queued.items()
                               for o in offsets}
        return self._queued_at

    def apart(self, offset: int) -> bool:
        """Whether the entry's dead-letter texts are kept apart."""
        fields = self._fields.get(str(offset))
        return fields is not None and len(fields) > _APART_AT

    def restore(self, offset: int, entry: Entry) -> Entry:
        """Remember ``entry`` read whole (with its texts kept apart)."""
        self._entries[offset] = entry
        return entry

    def set(self, offset: int, entry: Entry | None, *, apart: bool = False) -> None:
        """Set the entry of ``offset``; ``apart``: its texts are stored
        elsewhere, the chunk marks their place."""
        self._own()
        key = str(offset)
        self._fields.pop(key, None)
        self._pieces.pop(key, None)
        self._entries.pop(offset, None)
        self._sorted = None
        if (session := self._sessions().pop(offset, None)) is not None:
            offsets = self._queued[session]
            at = bisect.bisect_left(offsets, offset)
            self._queue(session, offsets[:at] + offsets[at + 1:])
        if entry is None:
            return
        self._entries[offset] = entry
        if _plainly_queued(entry):
            assert entry.session is not None
            self._sessions()[offset] = entry.session
            offsets = self._queued.get(entry.session, ())
            at = bisect.bisect_left(offsets, offset)
            self._queue(entry.session, offsets[:at] + (offset,) + offsets[at:])
        elif apart:
            fields = replace(entry, reason=None, description=None).encode()
            self._fields[key] = fields + [None] * (_APART_AT - len(fields)) + [1]
        else:
            self._fields[key] = entry.encode()

    def _queue(self, session: str, offsets: tuple[int, ...]) -> None:
        """Set the session's queued offsets here."""
        self._queued_pieces.pop(session, None)
        self._queued_body = None
        if offsets:
            self._queued[session] = offsets
        else:
            del self._queued[session]

    def offsets(self) -> list[int]:
        """The offsets that have an entry, in order."""
        if self._sorted is None:
            self._sorted = sorted([*map(int, self._fields), *self._sessions()])
        return self._sorted

    def encode(self) -> bytes | None:
        """The stored form; None when no entry is left (the key is deleted)."""
        fields, queued = self._fields, self._queued
        if not fields and not queued:
            return None
        pieces = self._pieces
        # every piece belongs to a field (set drops both): equal sizes, none missing
        missing = [key for key in fields if key not in pieces] \
            if len(pieces) != len(fields) else []
        whole = 3 * len(missing) > len(fields) and not self._dumped_whole
        if whole:
            body = _text(fields)[1:-1]
        else:
            for key in missing:
                pieces[key] = f'"{key}":' + _text(fields[key])
            body = ",".join([pieces[key] for key in fields])
        if queued:
            if self._queued_body is None:
                runs = self._queued_pieces
                for session, offsets in queued.items():
                    if session not in runs:
                        runs[session] = _text(session) + ":" + _text(
                            as_runs(offsets))
                self._queued_body = f'"{_QUEUED}":{{' + ",".join(
                    [runs[session] for session in queued]) + "}"
            body += ("," if body else "") + self._queued_body
        raw = ("{" + body + "}").encode()
        # handed to the cache as they are: this chunk copies them if it changes again
        self._remember(self._key, raw, (fields, pieces, whole, queued, self._queued_pieces,
                                        self._queued_body, self._entries, self._queued_at))
        self._shared = True
        self._dumped_whole = whole
        return raw


#: a parsed chunk as :attr:`_Chunk._parsed` keeps it
_Parsed = tuple[dict[str, list[object]], dict[str, str], bool, dict[str, tuple[int, ...]],
                dict[str, str], str | None, dict[int, Entry], dict[int, str] | None]


def _text(value: object) -> str:
    """``value`` as compact JSON text (through orjson: the standard
    library's encoder was 2-3 % of the engine's time settling one by one)."""
    return jsonbytes.dumps(value).decode()
