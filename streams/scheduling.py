"""Scheduled messages: invisible until due, then like any other message.

A scheduled message stays at its offset in the log; the window parks it as
SCHEDULED with its due time. Senders announce what they scheduled (the
``schedule`` command), so it is hidden and counted from the start; a receiver
that meets a not-yet-due message some other way (a record from another Kafka
client) parks it with the ``schedule`` settlement. When due, the lock timer's
sweep makes it available again, keeping its delivery count.
"""

from __future__ import annotations

from typing import Any

from streams.due_index import SCHEDULE
from streams.entries import Entry
from streams.states import AVAILABLE, CANCELLED, SCHEDULED, Event
from streams.window_view import WindowView
from topics.commands import CancelArgs, Command


def schedule(window: WindowView, items: list[list[int]], events: list[Event]
             ) -> dict[str, Any]:
    """Park offsets the sender scheduled; each answer is ok, or invalid for an
    offset already handed out (its receiver will park it when it reads it)."""
    parked, statuses = [], []
    window.see_log_end(max(offset for offset, _ in items) + 1, events)  # the sender saw them
    for offset, due in items:
        entry = window.entries.get(offset)
        fresh = offset >= window.next and entry is None
        if fresh or (entry is not None and entry.state == AVAILABLE):
            _park(window, offset, entry.deliveries if entry else 0, due)
            parked.append(offset)
            statuses.append(["ok", due])
        else:
            statuses.append(["invalid", 0])
    if parked:
        events.append(Event("scheduled", parked))
    return {"results": statuses}


def park(window: WindowView, offset: int, entry: Entry, due: int) -> None:
    """A receiver met a message before it was due: park it; the delivery the
    lock counted did not happen."""
    _park(window, offset, max(entry.deliveries - 1, 0), due)


def _park(window: WindowView, offset: int, deliveries: int, due: int) -> None:
    window.put(offset, Entry(SCHEDULED, deliveries, until=due))
    window.due.add(due, SCHEDULE, f"{offset:016x}", [offset])


def cancel(window: WindowView, cmd: Command[CancelArgs], _now: int, events: list[Event]
           ) -> dict[str, Any]:
    statuses: list[list[Any]] = []
    cancelled = []
    for offset in cmd.args.offsets:
        entry = window.entries.get(offset)
        if entry is None or entry.state != SCHEDULED:
            statuses.append(["invalid", 0])
            continue
        # Not yet reached, it stays cancelled so the grant loop skips it.
        window.put(offset, Entry(CANCELLED) if offset >= window.next else None)
        cancelled.append(offset)
        statuses.append(["ok", 0])
    if cancelled:
        events.append(Event("cancelled", cancelled))
    return {"results": statuses}


def activate(window: WindowView, offsets: list[int], events: list[Event]) -> None:
    """Scheduled messages whose time has come become available: those handed
    out before go back among the redeliveries, the others wait to be reached."""
    for offset in offsets:
        entry = window.entries.get(offset)
        assert entry is not None
        window.put(offset, Entry(AVAILABLE, entry.deliveries) if offset < window.next else None)
    if offsets:
        events.append(Event("activated", offsets))
