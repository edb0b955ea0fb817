"""States of an offset in an in-flight window, and what a command produces.

One letter per state keeps the stored entries small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topics.errors import ErrorCode

# Slot states (one letter keeps the stored window small).
LOCKED = "L"        # handed out under a peek-lock
AVAILABLE = "A"     # abandoned or lapsed: redelivered before fresh offsets
DEFERRED = "D"      # parked until fetched by sequence number
DEFERRED_LOCKED = "d"
DEAD = "X"          # in the dead-letter sub-queue
DEAD_LOCKED = "x"
SCHEDULED = "S"     # parked until due (the entry's time field holds the due time)
CANCELLED = "K"     # never to be handed out: cancelled, duplicate, forwarded or expired unseen
TRANSFER_DEAD = "T"  # in the transfer dead-letter sub-queue (forwarding failed)
TRANSFER_DEAD_LOCKED = "t"
QUEUED = "Q"        # accepted into its session, waiting for the session's receiver

#: states of a session's messages still to be delivered or settled (streams.sessions)
SESSION_PENDING = frozenset({QUEUED, LOCKED, AVAILABLE})

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
#: the seeds' reason and description for a message without a session id on
#: a session-enabled entity
SESSION_ID_NULL_REASON = "Session ID is null."
SESSION_ID_NULL_DESCRIPTION = ("Session enabled entity doesn't allow a message whose session "
                               "identifier is null.")


class Refused(Exception):
    """A command the window will not apply; the engine answers it with
    ``code`` and the message, and nothing of it is stored."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


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


@dataclass
class Settlements:
    """Settle commands applied together
    (:meth:`streams.window.InflightWindow.apply_settlements`): each one's
    result and events, or why it was refused; what they changed together."""

    each: list[tuple[dict[str, Any], list[Event]] | Refused]
    changed: bool
    writes: dict[bytes, bytes | None]
