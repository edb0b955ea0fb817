"""States of an offset in an in-flight window, and what a command produces.

One letter per state keeps the stored entries small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Slot states (one letter keeps the stored window small).
LOCKED = "L"        # handed out under a peek-lock
AVAILABLE = "A"     # abandoned or lapsed: redelivered before fresh offsets
COMPLETED = "C"     # settled; dropped as soon as ``start`` passes it
DEFERRED = "D"      # parked until fetched by sequence number
DEFERRED_LOCKED = "d"
DEAD = "X"          # in the dead-letter sub-queue
DEAD_LOCKED = "x"
SCHEDULED = "S"     # parked until due (the entry's time field holds the due time)
CANCELLED = "K"     # never to be handed out: cancelled, duplicate, forwarded or expired unseen
TRANSFER_DEAD = "T"  # in the transfer dead-letter sub-queue (forwarding failed)
TRANSFER_DEAD_LOCKED = "t"

#: sub-queue -> (its available state, its locked state)
SUB_QUEUE_STATES = {"deadletter": (DEAD, DEAD_LOCKED),
                    "transferdeadletter": (TRANSFER_DEAD, TRANSFER_DEAD_LOCKED)}
#: locked parked state -> the state its lock returns it to
UNLOCKED = {DEFERRED_LOCKED: DEFERRED, DEAD_LOCKED: DEAD, TRANSFER_DEAD_LOCKED: TRANSFER_DEAD}
PARKED_LOCKED = frozenset(UNLOCKED)

MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_EXPIRED_REASON = "TTLExpiredException"
MAX_HOPS_REASON = "MaxTransferHopCountExceeded"
TARGET_MISSING_REASON = "ForwardTargetNotFound"


@dataclass
class Event:
    """A settlement event for ``NS.__events``; one per kind per command."""

    type: str
    offsets: list[int]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(self.extra.get("count", len(self.offsets)))


@dataclass
class Outcome:
    result: dict[str, Any]
    events: list[Event]
    changed: bool = True
    #: store key -> new value (None: deleted), what the command changed
    writes: dict[bytes, bytes | None] = field(default_factory=dict)
