"""A queue's definition, as ``azure.servicebus.management``'s ``QueueProperties``,
and the defaults other entities share."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field

from topics.commands import Policy
from topics.entities.json_form import definition_json, from_definition

DEFAULT_LOCK = dt.timedelta(seconds=60)
MAX_LOCK = dt.timedelta(minutes=5)
DEFAULT_TTL = dt.timedelta(days=10675199)  # Service Bus's "never" (TimeSpan.MaxValue)
DEFAULT_DUPLICATE_WINDOW = dt.timedelta(minutes=10)
#: Service Bus's shortest ``auto_delete_on_idle``; its default is "never" (DEFAULT_TTL)
MIN_AUTO_DELETE_ON_IDLE = dt.timedelta(minutes=5)
PARTITIONED_COUNT = 4


@dataclass
class QueueProperties:
    """A queue's definition; stored in the namespace's entities topic."""

    name: str
    lock_duration: dt.timedelta = DEFAULT_LOCK
    max_delivery_count: int = 10
    default_message_time_to_live: dt.timedelta = DEFAULT_TTL
    dead_lettering_on_message_expiration: bool = False
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: dt.timedelta = DEFAULT_DUPLICATE_WINDOW
    requires_session: bool = False
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    max_message_size_in_kilobytes: int = 1024
    #: what the queue may hold (sends that would pass it fail, QuotaExceeded)
    max_size_in_megabytes: int = 1024
    enable_partitioning: bool = False
    partition_count: int = 1
    #: deleted by the engine (definition and log) once idle this long: no
    #: sends, receives, settlements or changes (:mod:`streams.idle_deleter`)
    auto_delete_on_idle: dt.timedelta = DEFAULT_TTL
    user_metadata: str | None = None
    created_at_utc: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    updated_at_utc: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def policy(self) -> Policy:
        """What the engine needs to know of this queue, sent with each command."""
        return Policy(
            int(self.lock_duration.total_seconds() * 1000), self.max_delivery_count,
            self.dead_lettering_on_message_expiration,
            int(self.duplicate_detection_history_time_window.total_seconds() * 1000)
            if self.requires_duplicate_detection else 0,
            int(self.default_message_time_to_live.total_seconds() * 1000)
            if self.expires_messages else 0,
            self.forward_to, self.forward_dead_lettered_messages_to,
            requires_session=self.requires_session, partitions=self.partition_count)

    @property
    def expires_messages(self) -> bool:
        return self.default_message_time_to_live < DEFAULT_TTL

    @property
    def path(self) -> str:
        """The entity its receivers and the engine's windows name."""
        return self.name

    def to_json(self) -> bytes:
        return definition_json("queue", self)

    @classmethod
    def from_json(cls, raw: bytes) -> QueueProperties:
        return from_definition(cls, json.loads(raw))
