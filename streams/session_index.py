"""What a window keeps per session, under its prefix (see :mod:`streams.sessions`).

* ``s<id>``: the :class:`Session` record: how many of its messages are
  pending (queued, locked or waiting for redelivery), its lock (batch and
  end), the size and time of its state;
* ``o<hash><range>``: its pending offsets, one sorted list per range of
  :data:`RANGE` offsets: a deep backlog costs a command one small key, and a
  message may join anywhere (a scheduled one that came due);
* ``r<first offset><id>``: the ready index of sessions with pending messages
  and no lock, oldest message first. The next available session is its first
  key, so idle sessions cost a command nothing;
* ``v<id>``: the session state (base64), written by ``set_session_state`` only.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

from streams.store import Txn

#: offsets per stored list of a session's pending offsets
RANGE = 1024


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

    def locked(self, now: int) -> bool:
        return self.batch != 0 and self.until > now

    def encode(self) -> bytes:
        return json.dumps([self.pending, self.batch, self.until, self.first, self.state_size,
                           self.state_at], separators=(",", ":")).encode()

    @classmethod
    def decode(cls, session_id: str, raw: bytes) -> Session:
        return cls(session_id, *json.loads(raw))

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
        self._offsets = prefix + b"o"
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
        bisect.insort(self._list(session_id, offset), offset)
        session.pending += 1
        if not session.batch and (session.first < 0 or offset < session.first):
            self._list_ready(session, offset)
        self._dirty.add(session_id)

    def remove(self, session_id: str, offset: int) -> None:
        session = self.get(session_id)
        offsets = self._list(session_id, offset)
        index = bisect.bisect_left(offsets, offset)
        if index < len(offsets) and offsets[index] == offset:
            del offsets[index]
            session.pending -= 1
        if not session.batch and session.first == offset:
            self._list_ready(session, self.first_offset(session_id))
        self._dirty.add(session_id)

    def offsets(self, session_id: str) -> Iterator[int]:
        """The session's pending offsets in log order, read list by list."""
        self._flush_lists()
        prefix = self._offsets + self.ident(session_id).encode()
        for key, _ in self._txn.range(prefix, prefix + b"~"):
            yield from list(self._list_at(key))

    def first_offset(self, session_id: str) -> int | None:
        return next(self.offsets(session_id), None)

    def _list(self, session_id: str, offset: int) -> list[int]:
        """The list holding ``offset``, to change."""
        key = self._offsets + self.ident(session_id).encode() + _hex(offset // RANGE)
        self._dirty_lists.add(key)
        return self._list_at(key)

    def _list_at(self, key: bytes) -> list[int]:
        offsets = self._lists.get(key)
        if offsets is None:
            raw = self._txn.get(key)
            offsets = self._lists[key] = json.loads(raw) if raw else []
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
                self._txn.put(key, json.dumps(offsets, separators=(",", ":")).encode())
            else:
                self._txn.delete(key)
        self._dirty_lists.clear()
