"""Scheduled messages: invisible until due, then like any other message.

A scheduled message stays at its offset in the log; the window parks it as
SCHEDULED with its due time. Senders announce what they scheduled (the
``schedule`` command), so it is hidden and counted from the start; a receiver
that meets a not-yet-due message some other way (a record from another Kafka
client) parks it with the ``schedule`` settlement. When due, the lock timer's
sweep makes it available again, keeping its delivery count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streams.states import AVAILABLE, CANCELLED, SCHEDULED, Event

if TYPE_CHECKING:
    from streams.window import InflightWindow


def schedule(window: InflightWindow, items: list[list[int]], events: list[Event]
             ) -> dict[str, Any]:
    """Park offsets the sender scheduled; each answer is ok, or invalid for an
    offset already handed out (its receiver will park it when it reads it)."""
    parked, statuses = [], []
    window.see_log_end(max(offset for offset, _ in items) + 1, events)  # the sender saw them
    for offset, due in items:
        slot = window.slots.get(offset)
        fresh = offset >= window.next and offset not in window.parked
        if fresh or (slot is not None and slot[0] == AVAILABLE):
            window.slots.pop(offset, None)
            window.parked[offset] = [SCHEDULED, slot[1] if slot else 0, 0, due, None, None, None]
            parked.append(offset)
            statuses.append(["ok", due])
        else:
            statuses.append(["invalid", 0])
    if parked:
        events.append(Event("scheduled", parked))
    return {"results": statuses}


def park(window: InflightWindow, offset: int, entry: list[Any], due: int) -> None:
    """A receiver met a message before it was due: park it; the delivery the
    lock counted did not happen."""
    window.slots.pop(offset, None)
    window.parked[offset] = [SCHEDULED, max(entry[1] - 1, 0), 0, due, None, None, None]


def cancel(window: InflightWindow, offsets: list[int], events: list[Event]) -> dict[str, Any]:
    statuses, cancelled = [], []
    for offset in offsets:
        entry = window.parked.get(offset)
        if entry is None or entry[0] != SCHEDULED:
            statuses.append(["invalid", 0])
            continue
        if offset >= window.next:  # not yet reached: the grant loop must skip it
            entry[0] = CANCELLED
        else:
            del window.parked[offset]
        cancelled.append(offset)
        statuses.append(["ok", 0])
    if cancelled:
        events.append(Event("cancelled", cancelled))
    return {"results": statuses}


def activate_due(window: InflightWindow, now: int, events: list[Event]) -> None:
    """Scheduled messages whose time has come become available."""
    due = [o for o, p in window.parked.items() if p[0] == SCHEDULED and p[3] <= now]
    for offset in due:
        entry = window.parked.pop(offset)
        if offset < window.next:  # handed out before: back among the redeliveries
            window.slots[offset] = [AVAILABLE, entry[1], 0, 0]
    if due:
        events.append(Event("activated", due))


def next_due(window: InflightWindow) -> int | None:
    dues = [p[3] for p in window.parked.values() if p[0] == SCHEDULED]
    return min(dues) if dues else None
