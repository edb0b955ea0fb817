"""Sessions: ordered, exclusively locked streams of the messages sharing a session id.

On a session-enabled entity the log scanner reads each record's session id
and accepts the offset into its session (``streams.acceptance``): it becomes a
QUEUED entry tagged with the session (stored as a run of the session's
offsets in its chunk, not an entry each: :mod:`streams.entries`). From then
on it is handed out only to the receiver holding the session's lock, in log
order, redeliveries first.
Senders key a session's messages by its id, so a session lives whole in one
partition, and one window holds its lock and its state.

What a window keeps per session is in :mod:`streams.session_index`.

A session with nothing pending, no lock and no state has no key at all. Its
lock's end is a timer (kind SESSION); the locks of the messages its receiver
holds end with it: they have no timers of their own, and when the session
lock lapses they are released as lapsed message locks are, each counting a
delivery.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from streams.due_index import SESSION
from streams.entries import Entry
from streams.session_index import Session
from streams.states import AVAILABLE, LOCKED, QUEUED, SESSION_PENDING, Event, Refused
from streams.window_view import WindowView
from topics.commands import (
    OP_INFO,
    AcquireArgs,
    Args,
    Command,
    HeldSessionArgs,
    ListSessionsArgs,
    LockSessionArgs,
    ReleaseSessionArgs,
    RenewSessionArgs,
    SessionStateArgs,
    SetSessionStateArgs,
    acquire_result,
    batch_id,
    lock_token,
)
from topics.errors import ErrorCode

#: the slot session lock tokens are derived for (no offset is this large)
_SESSION_SLOT = (1 << 63) - 1


def summaries(window: WindowView, now: int) -> list[dict[str, Any]]:
    """The state-topic records of the sessions the command changed: what the
    dashboard shows per session. A session that left no key gets ``gone``
    (its record is then deleted from the compacted topic)."""
    return [{"entity": window.entity, "partition": window.partition, "session": s.id,
             "active": s.pending, "locked_until": s.until if s.locked(now) else 0,
             "state_size": s.state_size, "gone": s.idle}
            for s in window.sessions.flushed.values()]


# --------------------------------------------------------------- window hooks
def on_put(window: WindowView, offset: int, old: Entry | None, new: Entry | None
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


def guard(window: WindowView, cmd: Command[Args], now: int) -> None:
    """Refuse, before anything changes, what needs a session it does not hold."""
    args = cmd.args
    if isinstance(args, AcquireArgs) and args.sub == "active" and window.requires_session:
        if args.session is None:
            raise Refused(ErrorCode.SESSION_REQUIRED, f"{window.entity} requires sessions: "
                          "receive with a session receiver (session_id=... or "
                          "NEXT_AVAILABLE_SESSION)")
    elif isinstance(args, LockSessionArgs) and not window.requires_session:
        raise Refused(ErrorCode.INVALID_OPERATION, f"{window.entity} does not require "
                      "sessions: receive without session_id")
    holder = _holder(args)
    if holder is not None and held(window, *holder, now) is None:
        raise Refused(ErrorCode.SESSION_LOCK_LOST, f"the lock on session {holder[0]!r} of "
                      f"{window.entity} was lost (it lapsed or another receiver holds it): "
                      "open a new session receiver, and renew the session lock sooner")


def _holder(args: Args) -> tuple[str, str] | None:
    """The session and token of a command that needs the session's lock held."""
    if OP_INFO[args.OP].holder:
        assert isinstance(args, HeldSessionArgs)
        return args.session, args.token
    if isinstance(args, AcquireArgs) and args.session is not None:
        assert args.token is not None  # the decoder reads a session's token with it
        return args.session, args.token
    return None


def token(window: WindowView, batch: int) -> str:
    return lock_token(window.secret, batch, _SESSION_SLOT)


def held(window: WindowView, session_id: str, given: str, now: int) -> Session | None:
    session = window.sessions.get(session_id)
    if not session.locked(now) or given != token(window, session.batch):
        return None
    return session


# ------------------------------------------------------------------ commands
def lock(window: WindowView, cmd: Command[LockSessionArgs], now: int, events: list[Event]
         ) -> dict[str, Any]:
    """Lock the named session, or the next available one: ``{"session": None}``
    when none is free; ``locked_until`` of the holder when it is taken. With
    ``first``, the session's first messages are locked and granted with it,
    as an acquire answers (``grants``)."""
    session_id = cmd.args.session or window.sessions.next_ready()
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
    held_by = token(window, batch)
    locked = {"session": session_id, "until": until, "token": held_by}
    if not cmd.args.first:
        return locked
    first = AcquireArgs("active", "peek_lock", cmd.args.first, 0, session_id, held_by)
    return acquire(window, first, events) | locked


def acquire(window: WindowView, args: AcquireArgs, events: list[Event]) -> dict[str, Any]:
    """The session's next messages, in order, redeliveries first."""
    assert args.session is not None
    session = window.sessions.get(args.session)
    picked: list[int] = []
    for offset in window.sessions.offsets(session.id):
        if len(picked) >= args.max:
            break
        entry = window.entries.get(offset)
        if entry is not None and entry.state in (QUEUED, AVAILABLE):
            picked.append(offset)
    if args.mode == "receive_and_delete":
        return acquire_result(window.delete_on_receipt(picked, events), window.next)
    deliveries = []
    for offset in picked:
        entry = window.entries.get(offset)
        assert entry is not None
        locked = Entry(LOCKED, entry.deliveries + 1, session.batch, session.until)
        window.put(offset, locked)
        deliveries.append(locked.deliveries)
    grants = [window.grant_group(picked, deliveries, session.batch, session.until)
              ] if picked else []
    if picked:
        events.append(Event("locked", picked, {"until": session.until,
                                               "session": session.id}))
    return acquire_result(grants, window.next, session.batch)


def renew(window: WindowView, cmd: Command[RenewSessionArgs], now: int, _events: list[Event]
          ) -> dict[str, Any]:
    """Extend the session lock, and with it the locks of the messages it holds."""
    session = window.sessions.get(cmd.args.session)
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


def release(window: WindowView, cmd: Command[ReleaseSessionArgs], _now: int,
            events: list[Event]) -> dict[str, Any]:
    """The receiver closed: the session is free again, and the messages it
    held and did not settle are abandoned (they count a delivery)."""
    session = window.sessions.get(cmd.args.session)
    window.due.discard(session.until, SESSION, window.sessions.ident(session.id), [session.id])
    _unlock(window, session, events, "abandoned")
    return {"released": True}


def lapse(window: WindowView, session_ids: list[str], now: int,
          events: list[Event]) -> None:
    """Session locks whose time is up: their messages go back, counting a delivery."""
    for session_id in session_ids:
        session = window.sessions.get(session_id)
        if session.batch and session.until <= now:
            _unlock(window, session, events, "lock_expired")


def get_state(window: WindowView, cmd: Command[SessionStateArgs], _now: int,
              _events: list[Event]) -> dict[str, Any]:
    return {"state": window.sessions.state(cmd.args.session)}


def set_state(window: WindowView, cmd: Command[SetSessionStateArgs], now: int,
              _events: list[Event]) -> dict[str, Any]:
    session = window.sessions.get(cmd.args.session)
    window.sessions.set_state(session, cmd.args.state, now)
    return {"state_size": session.state_size}


def listing(window: WindowView, cmd: Command[ListSessionsArgs], now: int,
            _events: list[Event]) -> dict[str, Any]:
    """``[id, active messages, locked until (0: free), state bytes, state set at]``
    per session, in id order; ``updated_after`` keeps those whose state was
    set after it."""
    rows: list[list[Any]] = []
    updated_after = cmd.args.updated_after
    last = None
    for session in window.sessions.listing(cmd.args.after, cmd.args.max):
        last = session.id
        if updated_after is not None and session.state_at <= updated_after:
            continue
        rows.append([session.id, session.pending,
                     session.until if session.locked(now) else 0,
                     session.state_size, session.state_at])
    return {"sessions": rows, "last": last}


def _held_offsets(window: WindowView, session: Session) -> list[int]:
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


def _unlock(window: WindowView, session: Session, events: list[Event], kind: str) -> None:
    window.release(_held_offsets(window, session), events, kind)
    window.sessions.unlock(session)

