"""Sessions: ordered, exclusively locked streams of the messages sharing a session id.

On a session-enabled entity the log scanner reads each record's session id
and accepts the offset into its session (``streams.acceptance``): it becomes a
QUEUED entry tagged with the session. From then on it is handed out only to
the receiver holding the session's lock, in log order, redeliveries first.
Senders key a session's messages by its id, so a session lives whole in one
partition, and one window holds its lock and its state.

What a window keeps per session, under its prefix:

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

A session with nothing pending, no lock and no state has no key at all. Its
lock's end is a timer (kind SESSION); the locks of the messages its receiver
holds end with it: they have no timers of their own, and when the session
lock lapses they are released as lapsed message locks are, each counting a
delivery.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streams.due_index import SESSION
from streams.entries import Entry
from streams.states import AVAILABLE, LOCKED, QUEUED, SESSION_PENDING, Event, Refused
from streams.store import Txn
from topics.commands import Command, batch_id, lock_token

if TYPE_CHECKING:
    from streams.window import InflightWindow

#: offsets per stored list of a session's pending offsets
RANGE = 1024
#: the slot session lock tokens are derived for (no offset is this large)
_SESSION_SLOT = (1 << 63) - 1
#: operations that need the session lock held by the command's token
_HOLDER_OPS = frozenset({"renew_session", "release_session", "session_state",
                         "set_session_state"})


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


def summaries(window: InflightWindow, now: int) -> list[dict[str, Any]]:
    """The state-topic records of the sessions the command changed: what the
    dashboard shows per session. A session that left no key gets ``gone``
    (its record is then deleted from the compacted topic)."""
    return [{"entity": window.entity, "partition": window.partition, "session": s.id,
             "active": s.pending, "locked_until": s.until if s.locked(now) else 0,
             "state_size": s.state_size, "gone": s.idle}
            for s in window.sessions.flushed.values()]


# --------------------------------------------------------------- window hooks
def on_put(window: InflightWindow, offset: int, old: Entry | None, new: Entry | None
           ) -> Entry | None:
    """Keep a session's pending offsets in step as an entry changes state;
    an entry keeps its session through every state it goes through."""
    session = old.session if old is not None else None
    if session is not None and new is not None and new.session is None:
        new = replace(new, session=session)
    session = session or (new.session if new is not None else None)
    if session is None:
        return new
    was = old is not None and old.state in SESSION_PENDING
    now = new is not None and new.state in SESSION_PENDING
    if was and not now:
        window.sessions.remove(session, offset)
    elif now and not was:
        window.sessions.add(session, offset)
    return new


def guard(window: InflightWindow, cmd: Command, now: int) -> None:
    """Refuse, before anything changes, what needs a session it does not hold."""
    session_id = cmd.args.get("session")
    if cmd.op == "acquire" and cmd.args["sub"] == "active" and window.requires_session:
        if session_id is None:
            raise Refused("SessionRequired", f"{window.entity} requires sessions: receive with "
                          "a session receiver (session_id=... or NEXT_AVAILABLE_SESSION)")
    elif cmd.op == "lock_session" and not window.requires_session:
        raise Refused("InvalidOperation", f"{window.entity} does not require sessions: "
                      "receive without session_id")
    if cmd.op in _HOLDER_OPS or (cmd.op == "acquire" and session_id is not None):
        if held(window, session_id, cmd.args["token"], now) is None:
            raise Refused("SessionLockLost", f"the lock on session {session_id!r} of "
                          f"{window.entity} was lost (it lapsed or another receiver holds it): "
                          "open a new session receiver, and renew the session lock sooner")


def token(window: InflightWindow, batch: int) -> str:
    return lock_token(bytes.fromhex(window.secret), batch, _SESSION_SLOT)


def held(window: InflightWindow, session_id: str, given: str, now: int) -> Session | None:
    session = window.sessions.get(session_id)
    if not session.locked(now) or given != token(window, session.batch):
        return None
    return session


# ------------------------------------------------------------------ commands
def lock(window: InflightWindow, cmd: Command, now: int, events: list[Event]) -> dict[str, Any]:
    """Lock the named session, or the next available one: ``{"session": None}``
    when none is free; ``locked_until`` of the holder when it is taken."""
    session_id = cmd.args["session"] or window.sessions.next_ready()
    if session_id is None:
        return {"session": None}
    session = window.sessions.get(session_id)
    if session.locked(now):
        return {"session": session_id, "taken": True, "until": session.until}
    if session.batch:  # lapsed, its timer not yet run
        _unlock(window, session, events, "lock_expired")
    batch, until = batch_id(cmd.id), now + window.lock_ms
    window.sessions.lock(session, batch, until)
    window.due.add(until, SESSION, window.sessions.ident(session_id), [session_id])
    return {"session": session_id, "until": until, "token": token(window, batch)}


def acquire(window: InflightWindow, cmd: Command, events: list[Event]) -> dict[str, Any]:
    """The session's next messages, in order, redeliveries first."""
    session = window.sessions.get(cmd.args["session"])
    picked = []
    for offset in window.sessions.offsets(session.id):
        if len(picked) >= cmd.args["max"]:
            break
        entry = window.entries.get(offset)
        if entry is not None and entry.state in (QUEUED, AVAILABLE):
            picked.append(offset)
    if cmd.args["mode"] == "receive_and_delete":
        return {"grants": window.delete_on_receipt(picked, events), "next": window.next}
    grants = []
    for offset in picked:
        entry = window.entries.get(offset)
        assert entry is not None
        locked = Entry(LOCKED, entry.deliveries + 1, session.batch, session.until)
        window.put(offset, locked)
        grants.append(window.grant(offset, locked))
    if picked:
        events.append(Event("locked", picked, {"until": session.until,
                                               "session": session.id}))
    return {"grants": grants, "next": window.next, "batch": session.batch}


def renew(window: InflightWindow, cmd: Command, now: int) -> dict[str, Any]:
    """Extend the session lock, and with it the locks of the messages it holds."""
    session = window.sessions.get(cmd.args["session"])
    ident = window.sessions.ident(session.id)
    window.due.discard(session.until, SESSION, ident, [session.id])
    until = now + window.lock_ms
    window.sessions.lock(session, session.batch, until)
    window.due.add(until, SESSION, ident, [session.id])
    for offset in _held_offsets(window, session):
        entry = window.entries.get(offset)
        assert entry is not None
        window.put(offset, replace(entry, until=until, locked_at=window.locked_at(entry)))
    return {"until": until}


def release(window: InflightWindow, cmd: Command, events: list[Event]) -> dict[str, Any]:
    """The receiver closed: the session is free again, and the messages it
    held and did not settle are abandoned (they count a delivery)."""
    session = window.sessions.get(cmd.args["session"])
    window.due.discard(session.until, SESSION, window.sessions.ident(session.id), [session.id])
    _unlock(window, session, events, "abandoned")
    return {"released": True}


def lapse(window: InflightWindow, session_ids: list[str], now: int,
          events: list[Event]) -> None:
    """Session locks whose time is up: their messages go back, counting a delivery."""
    for session_id in session_ids:
        session = window.sessions.get(session_id)
        if session.batch and session.until <= now:
            _unlock(window, session, events, "lock_expired")


def get_state(window: InflightWindow, cmd: Command) -> dict[str, Any]:
    return {"state": window.sessions.state(cmd.args["session"])}


def set_state(window: InflightWindow, cmd: Command, now: int) -> dict[str, Any]:
    session = window.sessions.get(cmd.args["session"])
    window.sessions.set_state(session, cmd.args["state"], now)
    return {"state_size": session.state_size}


def listing(window: InflightWindow, cmd: Command, now: int) -> dict[str, Any]:
    """``[id, active messages, locked until (0: free), state bytes, state set at]``
    per session, in id order; ``updated_after`` keeps those whose state was
    set after it."""
    rows = []
    updated_after = cmd.args["updated_after"]
    last = None
    for session in window.sessions.listing(cmd.args["after"], cmd.args["max"]):
        last = session.id
        if updated_after is not None and session.state_at <= updated_after:
            continue
        rows.append([session.id, session.pending,
                     session.until if session.locked(now) else 0,
                     session.state_size, session.state_at])
    return {"sessions": rows, "last": last}


def _held_offsets(window: InflightWindow, session: Session) -> list[int]:
    """Offsets the session's receiver holds locked: all come before its first
    queued message, as messages are handed out in order."""
    out = []
    for offset in window.sessions.offsets(session.id):
        entry = window.entries.get(offset)
        if entry is None or entry.state == QUEUED:
            break
        if entry.state == LOCKED:
            out.append(offset)
    return out


def _unlock(window: InflightWindow, session: Session, events: list[Event], kind: str) -> None:
    window.release(_held_offsets(window, session), events, kind)
    window.sessions.unlock(session)

