"""Acceptance: what the engine learns from a queue's headers before delivery.

For queues with duplicate detection or a default time to live, the engine's
log scanner (``streams.log_scanner``) reads each record's headers and sends
``accept`` commands for consecutive ranges of offsets. Offsets are handed out
only once accepted (``window.scanned``), so a duplicate can never slip out
before it is known to be one. An accepted range may carry, per offset:

* a duplicate mark: the message is acknowledged to its sender but never
  delivered (an event records it);
* a due time: a scheduled message, parked until due;
* an expiry: the window expires the message on its own timer, whether or not
  a receiver is there (dead-lettered or dropped, by the queue's policy);
* for a subscription, a filter verdict: no rule matched (never delivered to
  it, a ``filtered`` event records it), or a filter failed on the message
  (dead-lettered with the error when the subscription says so; otherwise a
  ``filter_failed`` event says why the rule did not match).

* on a session-enabled entity, the message's session: it joins its
  session's pending messages (``streams.sessions``); one without a session
  id, or with one its partition cannot hold, is dead-lettered.

Each offset's findings are an :class:`Item`; offsets without one are plain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streams.due_index import SCHEDULE
from streams.entries import Entry
from streams.states import (
    AVAILABLE,
    CANCELLED,
    DEAD,
    LOCKED,
    MAX_HOPS_REASON,
    QUEUED,
    SCHEDULED,
    SESSION_ID_NULL_DESCRIPTION,
    SESSION_ID_NULL_REASON,
    TARGET_MISSING_REASON,
    TRANSFER_DEAD,
    Event,
)
from streams.window_view import WindowView
from topics.commands import Args, Command, DeadForwardedArgs, Op
from topics.rule_set import FILTER_FAILED_REASON
from topics.runs import as_runs, run_pairs, run_total

# Marks of an accepted offset.
(PLAIN, DUPLICATE, FORWARDED, TOO_MANY_HOPS, TARGET_MISSING, FILTERED, FILTER_FAILED,
 NO_SESSION, BAD_SESSION) = range(9)
#: a session id too long, or in a partition other than its session's
BAD_SESSION_REASON = "InvalidSessionId"
_SESSION_FAILURES = {NO_SESSION: SESSION_ID_NULL_REASON, BAD_SESSION: BAD_SESSION_REASON}
MAX_HOPS = 4
_TRANSFER_FAILURES = {TOO_MANY_HOPS: MAX_HOPS_REASON, TARGET_MISSING: TARGET_MISSING_REASON}


@dataclass(frozen=True, slots=True)
class Item:
    """What the scanner found out about one offset."""

    offset: int
    expires: int = 0          # when its time to live ends (ms; 0: never)
    due: int = 0              # when a scheduled message is due (ms; 0: now)
    mark: int = PLAIN
    error: str | None = None  # why a filter failed on it
    session: str | None = None  # its session (session-enabled entities)

    def with_session(self, session: str) -> Item:
        """This item with ``session``. Made here rather than by
        ``dataclasses.replace`` (3.1 -> 1.3 us): the scanner does it for
        every session message it reads (py-spy of bench-sessions' engine)."""
        return Item(self.offset, self.expires, self.due, self.mark, self.error, session)


@dataclass(frozen=True)
class AcceptArgs(Args):
    """The log scanner vouches for the offsets of ``[first, end)``; ``items``:
    what it found per offset (the others are plain); ``left_out``: the
    offsets the subscription's rules did not select, none failing, as flat
    ``[first, end)`` runs (``topics.runs``; an item each cost a
    topic's ten subscriptions more than their rules, and an offset each,
    gone through three times, was most of an accept's time)."""

    OP = Op.ACCEPT
    first: int
    end: int
    items: tuple[Item, ...]
    left_out: tuple[int, ...] = ()


def accept(window: WindowView, cmd: Command[AcceptArgs], _now: int, events: list[Event]
           ) -> dict[str, Any]:
    """Apply one scanned range; a range that does not continue where the
    window stands (a repeat after a crash, say) changes nothing."""
    first, end = cmd.args.first, cmd.args.end
    if window.scanned is None or first != window.scanned or end < first:
        return {"accepted": False, "scanned": window.scanned}
    duplicates: list[int] = []
    scheduled: list[int] = []
    forwarded: list[int] = []
    filtered: list[int] = []  # those whose filter failed, neither selected nor dead-lettered
    expiries: list[list[int]] = []
    failed: dict[str, list[int]] = {}  # why a filter failed -> on which messages
    left_out = _within(cmd.args.left_out, first, end)
    window.fit_chunks(end - first, end - first - run_total(left_out))
    if window.requires_session:
        _reach(window, end)
    for item in cmd.args.items:
        offset, expires, due, mark, error = (item.offset, item.expires, item.due, item.mark,
                                             item.error)
        if not first <= offset < end:
            continue
        if mark in _SESSION_FAILURES:
            reason, description = _SESSION_FAILURES[mark], error or SESSION_ID_NULL_DESCRIPTION
            window.put(offset, Entry(DEAD, reason=reason, description=description,
                                     source=window.entity))
            events.append(Event("dead_lettered", [offset], {
                "reason": reason, "description": description}))
            continue
        if error and mark != FILTER_FAILED:
            failed.setdefault(error, []).append(offset)
        if mark in (DUPLICATE, FORWARDED, FILTERED):
            {DUPLICATE: duplicates, FORWARDED: forwarded, FILTERED: filtered}[mark].append(offset)
            continue
        if mark == FILTER_FAILED:
            window.put(offset, Entry(DEAD, reason=FILTER_FAILED_REASON, description=error,
                                     source=window.entity))
            events.append(Event("dead_lettered", [offset], {
                "reason": FILTER_FAILED_REASON, "description": error}))
            continue
        if mark in _TRANSFER_FAILURES:
            reason = _TRANSFER_FAILURES[mark]
            window.put(offset, Entry(TRANSFER_DEAD, reason=reason,
                                     description=_describe(reason, window),
                                     source=window.entity))
            events.append(Event("transfer_dead_lettered", [offset], {"reason": reason}))
            continue
        if due:
            window.put(offset, Entry(SCHEDULED, until=due, session=item.session))
            window.due.add(due, SCHEDULE, f"{offset:016x}", [offset])
            scheduled.append(offset)
        elif item.session is not None:
            _join_session(window, offset, item.session)
        if expires:
            expiries.append([offset, expires])
    if filtered:
        left_out = _union(left_out, as_runs(sorted(filtered)))
    window.leave_out(_union(left_out, as_runs(sorted([*duplicates, *forwarded])))
                     if duplicates or forwarded else left_out)
    window.expire_later(expiries)
    window.scanned = end
    window.see_log_end(end, events)
    if duplicates:
        events.append(Event("duplicate", duplicates))
    if left_out:  # as runs: most offsets of a topic are left out by most subscriptions
        events.append(Event("filtered", [], {"ranges": left_out,
                                             "count": run_total(left_out)}))
    if failed:  # one event says why: the first error, and on which messages
        first_error = next(iter(failed))
        events.append(Event("filter_failed", sorted(o for g in failed.values() for o in g), {
            "description": first_error if len(failed) == 1
            else f"{first_error} (and {len(failed) - 1} other errors)"}))
    if forwarded:
        events.append(Event("forwarded", forwarded, {"to": window.forward_to}))
    if scheduled:
        events.append(Event("scheduled", scheduled))
    return {"accepted": True, "scanned": end}


def _within(runs: tuple[int, ...], first: int, end: int) -> list[int]:
    """Flat ``runs`` cut to ``[first, end)``."""
    if not runs or (runs[0] >= first and runs[-1] <= end):  # as the scanner makes them
        return list(runs)
    cut: list[int] = []
    for a, b in run_pairs(runs):
        a, b = max(a, first), min(b, end)
        if a < b:
            cut += (a, b)
    return cut


def _union(*runs: list[int]) -> list[int]:
    """Flat runs that do not overlap, joined into one flat list in order."""
    joined: list[int] = []
    for a, b in sorted(pair for flat in runs for pair in run_pairs(flat)):
        if joined and joined[-1] >= a:
            joined[-1] = max(joined[-1], b)
        else:
            joined += (a, b)
    return joined


def _reach(window: WindowView, end: int) -> None:
    """On a session-enabled entity every accepted offset joins its session
    (or the dead letters): none is left for the plain grant loop, and the
    entries it had ahead (scheduled by their sender) are reached."""
    if end <= window.next:
        return
    window.ahead -= sum(1 for _ in window.entries.between(window.next, end))
    window.next = end


def _join_session(window: WindowView, offset: int, session: str) -> None:
    """The offset waits in its session; one a sender cancelled is gone."""
    entry = window.entries.get(offset)
    if entry is None or entry.state == SCHEDULED:
        window.put(offset, Entry(QUEUED, session=session))
    elif entry.state == CANCELLED:
        window.put(offset, None)


def dead_forwarded(window: WindowView, cmd: Command[DeadForwardedArgs], _now: int,
                   events: list[Event]) -> dict[str, Any]:
    """Dead letters the scanner copied to ``forward_dead_letters_to`` leave
    the sub-queue (unless a receiver holds one: the next sweep retries)."""
    moved = [o for o in cmd.args.offsets
             if (entry := window.entries.get(o)) is not None and entry.state == DEAD]
    for offset in moved:
        window.settled(offset)
    if moved:
        events.append(Event("forwarded", moved, {"to": window.forward_dead_letters_to}))
    return {"moved": moved}


def _describe(reason: str, window: WindowView) -> str:
    if reason == MAX_HOPS_REASON:
        return (f"forwarding to {window.forward_to!r} would take the message over "
                f"{MAX_HOPS} transfer hops")
    return f"the forward_to target {window.forward_to!r} does not exist"


def expire_due(window: WindowView, now: int, items: list[list[int]],
               events: list[Event]) -> None:
    """Expire the messages of ``items`` (``[offset, expires]``) whose time to
    live has passed and that nobody holds a lock on; a locked one is looked at
    again when its lock ends, one not yet due when it is."""
    later = []
    for offset, expires in items:
        entry = window.entries.get(offset)
        if expires > now:
            later.append([offset, expires])
        elif entry is not None and entry.state == LOCKED:
            later.append([offset, max(entry.until, now + 1)])
        elif (entry is not None and entry.state in (AVAILABLE, SCHEDULED, QUEUED)) or (
                entry is None and offset >= window.next):
            window.expire_message(offset, events)
    window.expire_later(later)
