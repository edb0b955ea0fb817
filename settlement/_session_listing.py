"""Listing the sessions of a session-enabled queue or subscription.

The engine keeps a record per session that has messages, a lock or state
(``streams.sessions``); ``list_sessions`` pages through one window's records
in id order. The client lists ids, as the SDK does; the administration
client and the CLI show each session's counts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

from settlement._engine_link import EngineLink, check_reply
from settlement._settled_stats import log_ends, settled_stats
from topics.commands import ListSessionsArgs
from topics.entities import QueueProperties, SubscriptionProperties
from topics.times import epoch_ms, utc_from_ms

_PAGE = 1000


@dataclass
class SessionRuntimeProperties:
    """One session of an entity, as the engine sees it now."""

    session_id: str
    active_message_count: int
    locked_until_utc: dt.datetime | None
    state_size_in_bytes: int
    state_updated_at_utc: dt.datetime | None

    @property
    def is_locked(self) -> bool:
        return self.locked_until_utc is not None


def list_sessions(link: EngineLink, props: QueueProperties | SubscriptionProperties,
                  state_updated_after: dt.datetime | None = None
                  ) -> Iterator[SessionRuntimeProperties]:
    """Every session of the entity (with ``state_updated_after``, those whose
    state was set after it), partition by partition, in id order."""
    updated_after = None if state_updated_after is None else epoch_ms(state_updated_after)
    settled_stats(link, props, log_ends(link, props))  # sessions of what was sent till now
    for partition in range(props.partition_count):
        after = None
        while True:
            reply = link.call(link.command(props.path, partition,
                                           ListSessionsArgs(after, _PAGE, updated_after)))
            check_reply(reply, props.path)
            for session_id, active, until, size, state_at in reply.result["sessions"]:
                yield SessionRuntimeProperties(
                    session_id, active, utc_from_ms(until) if until else None, size,
                    utc_from_ms(state_at) if state_at else None)
            after = reply.result["last"]
            if after is None:
                break


def session_ids(link: EngineLink, props: QueueProperties | SubscriptionProperties,
                state_updated_after: dt.datetime | None) -> list[str]:
    """Ids of the sessions with active messages or stored state (or, with
    ``state_updated_after``, whose state was set after it)."""
    return [s.session_id for s in list_sessions(link, props, state_updated_after)
            if state_updated_after is not None or s.active_message_count
            or s.state_size_in_bytes]
