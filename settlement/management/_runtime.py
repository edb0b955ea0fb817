"""Counts of entities, as ``azure.servicebus.management`` returns them: from the
engine's windows and the log ends, never stored."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass
class QueueRuntimeProperties:
    """Counts of a queue, from the engine's windows and the log ends."""

    name: str
    active_message_count: int = 0
    dead_letter_message_count: int = 0
    scheduled_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    transfer_message_count: int = 0
    deferred_message_count: int = 0
    locked_message_count: int = 0
    size_in_bytes: int = 0
    created_at_utc: dt.datetime | None = None
    updated_at_utc: dt.datetime | None = None
    #: the SDK's; not tracked here (the engine keeps its entities' last use
    #: in memory, for auto_delete_on_idle): always None
    accessed_at_utc: dt.datetime | None = None

    @property
    def total_message_count(self) -> int:
        return (self.active_message_count + self.dead_letter_message_count
                + self.scheduled_message_count + self.transfer_dead_letter_message_count
                + self.deferred_message_count)


@dataclass
class TopicRuntimeProperties:
    """Counts of a topic."""

    name: str
    subscription_count: int = 0
    scheduled_message_count: int = 0
    created_at_utc: dt.datetime | None = None
    updated_at_utc: dt.datetime | None = None
    accessed_at_utc: dt.datetime | None = None


@dataclass
class SubscriptionRuntimeProperties:
    """Counts of a subscription, from the engine's windows."""

    name: str
    active_message_count: int = 0
    dead_letter_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    transfer_message_count: int = 0
    deferred_message_count: int = 0
    scheduled_message_count: int = 0
    locked_message_count: int = 0
    created_at_utc: dt.datetime | None = None
    updated_at_utc: dt.datetime | None = None
    accessed_at_utc: dt.datetime | None = None

    @property
    def total_message_count(self) -> int:
        return (self.active_message_count + self.dead_letter_message_count
                + self.transfer_dead_letter_message_count + self.deferred_message_count
                + self.scheduled_message_count)
