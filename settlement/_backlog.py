"""The backlog copy of a paired client's message: what the client writes
to a backlog queue of the secondary namespace (:mod:`settlement.pairing`)
and the syphon reads back (:mod:`settlement._syphon`)."""

from __future__ import annotations

from settlement.message import ServiceBusMessage, copy_message

#: application properties of a backlog copy: where it goes, its replay id,
#: when its first attempt began (epoch ms) and, per partition of the
#: destination, the offset after which a late arrival could be found
DESTINATION = "x-paired-destination"
REPLAY = "x-paired-replay-id"
FIRST_TRY_MS = "x-paired-first-try-ms"
SCAN_FROM = "x-paired-scan-from"
BACKLOG_PROPERTIES = (DESTINATION, REPLAY, FIRST_TRY_MS, SCAN_FROM)


def destination(kind: str, entity: str) -> str:
    """How a backlog copy names where it goes: ``queue:NAME`` or ``topic:NAME``."""
    return f"{kind}:{entity}"


def backlog_copy(message: ServiceBusMessage, where: str, replay_id: str, first_try_ms: int,
                 scan_from: str) -> ServiceBusMessage:
    """The message as a backlog queue holds it: every field kept, plus where
    it goes and how to tell whether it reached the primary after all."""
    copy = copy_message(message, {DESTINATION: where, REPLAY: replay_id,
                                  FIRST_TRY_MS: first_try_ms, SCAN_FROM: scan_from})
    copy.scheduled_enqueue_time_utc = message.scheduled_enqueue_time_utc
    return copy
