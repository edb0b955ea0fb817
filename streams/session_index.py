"""What a window keeps per session, under its prefix (see :mod:`streams.sessions`).

* ``s<id>``: the :class:`Session` record: how many of its messages are
  pending (queued, locked or waiting for redelivery), its lock (batch and
  end), the size and time of its state;
* ``p<hash><bound>``: its pending offsets once there are more than
  :data:`INLINE_MAX` (up to that many are kept in its record, so a session
  of a few messages costs two keys: its record and its place in the ready
  index), in sorted lists of at most :data:`LIST_MAX`, each under a lower
  bound of what it holds (a list holds the offsets from its bound to the
  next list's). A deep backlog costs a command one small key; a message may
  join anywhere (a scheduled one that came due);
* ``r<first offset><id>``: the ready index of sessions with pending messages
  and no lock, oldest message first. The next available session is its first
  key, so idle sessions cost a command nothing;
* ``v<id>``: the session state (base64), written by ``set_session_state`` only.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from streams.store import Txn
from topics import jsonbytes

#: most offsets in one stored list of a session's pending offsets
LIST_MAX = 1024
#: most pending offsets kept in a session's own record; past this they move
#: to lists of their own, until none is left
INLINE_MAX = 64


@dataclass
class Session:
    """One session's record in a window."""

    id: str
    pending: int = 0     # messages queued, locked or waiting for redelivery
    batch: int = 0       # the lock's batch (0: not locked)
    until: int = 0       # the lock's end
    first: int = -1      # its position in the ready index (-1: not listed)
    state_size: int = 0  # bytes of session state
    state_at: int = 0    # when the state was last set (ms)
    #: the bounds of its lists of pending offsets, sorted (kept here, so that
    #: finding a list reads no range)
    bounds: list[int] = field(default_factory=list)
    #: its pending offsets, sorted, while they are few (None: in its lists)
    inline: list[int] | None = field(default_factory=list)

    def locked(self, now: int) -> bool:
        return self.batch != 0 and self.until > now

    def encode(self) -> bytes:
        return jsonbytes.dumps([self.pending, self.batch, self.until, self.first,
                                self.state_size, self.state_at, self.bounds, self.inline])

    @classmethod
    def decode(cls, session_id: str, raw: bytes) -> Session:
        fields = jsonbytes.loads(raw)
        if len(fields) == 7:  # stored before offsets were kept in the record
            fields.append(None if fields[6] else [])
        return cls(session_id, *fields)

    @property
    def idle(self) -> bool:
        """Nothing to keep: no message, no lock, no state."""
        return not (self.pending or self.batch or self.state_size)


def _hex(n: int) -> bytes:
    return f"{n:012x}".encode()


class SessionIndex:
    """One window's sessions over a transaction; :meth:`flush` writes them."""

    def __init__(self, txn: Txn, prefix: bytes) -> None:
        self._txn = txn
        self._records = prefix + b"s"
        self._offsets = prefix + b"p"
        self._ready = prefix + b"r"
        self._states = prefix + b"v"
        self._loaded: dict[str, Session] = {}
        self._lists: dict[bytes, list[int]] = {}
        self._dirty: set[str] = set()
        self._dirty_lists: set[bytes] = set()
        #: sessions this command changed, as stored (for the state topic)
        self.flushed: dict[str, Session] = {}

    def get(self, session_id: str) -> Session:
        session = self._loaded.get(session_id)
        if session is None:
            raw = self._txn.get(self._records + session_id.encode())
            session = Session.decode(session_id, raw) if raw else Session(session_id)
            self._loaded[session_id] = session
        return session

    @staticmethod
    def ident(session_id: str) -> str:
        """A fixed-width name of the session for keys (its id may be long)."""
        return hashlib.blake2b(session_id.encode(), digest_size=8).hexdigest()

    # ---------------------------------------------------------- pending offsets
    def add(self, session_id: str, offset: int) -> None:
        session = self.get(session_id)
        if session.inline is None:
            bisect.insort(self._list(session_id, offset), offset)
        else:
            bisect.insort(session.inline, offset)
            if len(session.inline) > INLINE_MAX:
                self._spill(session)
        session.pending += 1
        if not session.batch and (session.first < 0 or offset < session.first):
            self._list_ready(session, offset)
        self._dirty.add(session_id)

    def remove(self, session_id: str, offset: int) -> None:
        session = self.get(session_id)
        bounds = self._bounds_of(session_id)
        at = bisect.bisect_right(bounds, offset) - 1
        if session.inline is not None:
            offsets = session.inline
        else:
            offsets = self._list_at(self._list_key(session_id, bounds[at])) if at >= 0 else []
        index = bisect.bisect_left(offsets, offset)
        if index < len(offsets) and offsets[index] == offset:
            del offsets[index]
            session.pending -= 1
            if session.inline is None:
                self._dirty_lists.add(self._list_key(session_id, bounds[at]))
                if not offsets:
                    del bounds[at]
                if not bounds:  # none left: the next ones are kept in the record again
                    session.inline = []
        if not session.batch and session.first == offset:
            self._list_ready(session, self.first_offset(session_id))
        self._dirty.add(session_id)

    def offsets(self, session_id: str) -> Iterator[int]:
        """The session's pending offsets in log order, read list by list."""
        inline = self.get(session_id).inline
        if inline is not None:
            yield from list(inline)
            return
        for bound in list(self._bounds_of(session_id)):
            yield from list(self._list_at(self._list_key(session_id, bound)))

    def first_offset(self, session_id: str) -> int | None:
        return next(self.offsets(session_id), None)

    def _list(self, session_id: str, offset: int) -> list[int]:
        """The list ``offset`` belongs in, to add it to: the one with the
        greatest bound up to it; the first, bound anew, if it is below all;
        a new one if there is none. A list grown past :data:`LIST_MAX` is
        split first, its upper half under its own bound."""
        bounds = self._bounds_of(session_id)
        at = max(0, bisect.bisect_right(bounds, offset) - 1)
        if not bounds:
            bounds.append(offset)
        elif offset < bounds[0]:
            self._rebound(session_id, bounds[0], offset)
            bounds[0] = offset
        key = self._list_key(session_id, bounds[at])
        offsets = self._list_at(key)
        if len(offsets) >= LIST_MAX:
            upper = offsets[len(offsets) // 2:]
            del offsets[len(offsets) // 2:]
            self._dirty_lists.add(key)
            bounds.insert(at + 1, upper[0])
            self._lists[self._list_key(session_id, upper[0])] = upper
            self._dirty_lists.add(self._list_key(session_id, upper[0]))
            return self._list(session_id, offset)
        self._dirty_lists.add(key)
        return offsets

    def _spill(self, session: Session) -> None:
        """Move a session's pending offsets from its record to a list of their own."""
        offsets, session.inline = session.inline or [], None
        session.bounds[:] = [offsets[0]]
        key = self._list_key(session.id, offsets[0])
        self._lists[key] = offsets
        self._dirty_lists.add(key)

    def _rebound(self, session_id: str, old: int, new: int) -> None:
        """Move the list under bound ``old`` to bound ``new``."""
        old_key, new_key = self._list_key(session_id, old), self._list_key(session_id, new)
        self._lists[new_key] = self._list_at(old_key)
        self._lists[old_key] = []  # written as a delete
        self._dirty_lists.update((old_key, new_key))

    def _bounds_of(self, session_id: str) -> list[int]:
        """The bounds of the session's lists, to read or change (changing
        them changes its record)."""
        return self.get(session_id).bounds

    def _list_key(self, session_id: str, bound: int) -> bytes:
        return self._offsets + self.ident(session_id).encode() + _hex(bound)

    def _list_at(self, key: bytes) -> list[int]:
        offsets = self._lists.get(key)
        if offsets is None:
            raw = self._txn.get(key)
            offsets = self._lists[key] = jsonbytes.loads(raw) if raw else []
        return offsets

    # -------------------------------------------------------------------- lock
    def lock(self, session: Session, batch: int, until: int) -> None:
        self._list_ready(session, None)
        session.batch, session.until = batch, until
        self._dirty.add(session.id)

    def unlock(self, session: Session) -> None:
        session.batch = session.until = 0
        if session.pending:
            self._list_ready(session, self.first_offset(session.id))
        self._dirty.add(session.id)

    def next_ready(self) -> str | None:
        """The unlocked session whose oldest pending message is oldest."""
        found = self._txn.first(self._ready, self._ready + b"~")
        return None if found is None else found[0][len(self._ready) + 12:].decode()

    def _list_ready(self, session: Session, first: int | None) -> None:
        """List the session in the ready index at ``first`` (None: unlist it)."""
        if session.first >= 0:
            self._txn.delete(self._ready + _hex(session.first) + session.id.encode())
        session.first = -1 if first is None else first
        if first is not None:
            self._txn.put(self._ready + _hex(first) + session.id.encode(), b"")

    # ------------------------------------------------------------------- state
    def state(self, session_id: str) -> str | None:
        raw = self._txn.get(self._states + session_id.encode())
        return None if raw is None else raw.decode()

    def set_state(self, session: Session, state: str | None, now: int) -> None:
        key = self._states + session.id.encode()
        if state is None:
            self._txn.delete(key)
            session.state_size = 0
        else:
            self._txn.put(key, state.encode())
            session.state_size = len(base64.b64decode(state))
        session.state_at = now
        self._dirty.add(session.id)

    def listing(self, after: str | None, limit: int) -> Iterator[Session]:
        """Sessions in id order, from the first after ``after``."""
        self.flush()
        start = self._records + (after.encode() + b"\x00" if after is not None else b"")
        for key, raw in self._txn.range(start, self._records + b"\xff"):
            if limit <= 0:
                return
            limit -= 1
            session_id = key[len(self._records):].decode()
            yield self._loaded.get(session_id) or Session.decode(session_id, raw)

    # ----------------------------------------------------------------- storage
    def flush(self) -> None:
        self._flush_lists()
        for session_id in self._dirty:
            session = self._loaded[session_id]
            key = self._records + session_id.encode()
            if session.idle:
                self._txn.delete(key)
            else:
                self._txn.put(key, session.encode())
            self.flushed[session_id] = session
        self._dirty.clear()

    def _flush_lists(self) -> None:
        for key in self._dirty_lists:
            offsets = self._lists[key]
            if offsets:
                self._txn.put(key, jsonbytes.dumps(offsets))
            else:
                self._txn.delete(key)
        self._dirty_lists.clear()
