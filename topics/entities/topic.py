"""Topic and subscription properties, as ``azure.servicebus.management``.

A topic is a log (``NS.topic.TOPIC``); a subscription is a window of the
engine over that log, with its own lock duration, delivery count, time to
live, dead letters and rules. What the engine needs of a subscription, its
policy, combines the subscription's settings, its topic's (time to live,
duplicate detection) and its rules.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field

from topics import names
from topics.commands import Policy
from topics.entities.json_form import definition_json, from_definition
from topics.entities.queue import DEFAULT_DUPLICATE_WINDOW, DEFAULT_LOCK, DEFAULT_TTL
from topics.entities.rule import RuleProperties


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ms(value: dt.timedelta) -> int:
    return int(value.total_seconds() * 1000)


@dataclass
class TopicProperties:
    """A topic's definition; stored in the namespace's entities topic."""

    name: str
    default_message_time_to_live: dt.timedelta = DEFAULT_TTL
    max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: dt.timedelta = DEFAULT_DUPLICATE_WINDOW
    max_message_size_in_kilobytes: int = 1024
    enable_partitioning: bool = False
    partition_count: int = 1
    support_ordering: bool = True
    #: deleted by the engine, with its subscriptions, once idle this long
    auto_delete_on_idle: dt.timedelta = DEFAULT_TTL
    user_metadata: str | None = None
    created_at_utc: dt.datetime = field(default_factory=_now)
    updated_at_utc: dt.datetime = field(default_factory=_now)

    @property
    def expires_messages(self) -> bool:
        return self.default_message_time_to_live < DEFAULT_TTL

    def to_json(self) -> bytes:
        return definition_json("topic", self)

    @classmethod
    def from_json(cls, raw: bytes) -> TopicProperties:
        return from_definition(cls, json.loads(raw))


@dataclass
class SubscriptionProperties:
    """A subscription's definition. ``topic_name`` and ``partition_count``
    (the topic's) say which log it reads; ``begin_offsets`` where it starts
    in each partition: a subscription gets what is published from its
    creation on."""

    name: str
    topic_name: str = ""
    lock_duration: dt.timedelta = DEFAULT_LOCK
    requires_session: bool = False
    default_message_time_to_live: dt.timedelta = DEFAULT_TTL
    dead_lettering_on_message_expiration: bool = False
    dead_lettering_on_filter_evaluation_exceptions: bool = True
    max_delivery_count: int = 10
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None
    partition_count: int = 1
    begin_offsets: list[int] = field(default_factory=list)
    #: deleted by the engine once idle this long
    auto_delete_on_idle: dt.timedelta = DEFAULT_TTL
    created_at_utc: dt.datetime = field(default_factory=_now)
    updated_at_utc: dt.datetime = field(default_factory=_now)

    @property
    def path(self) -> str:
        """``TOPIC/subscriptions/NAME``: the entity its receivers name."""
        return names.subscription_path(self.topic_name, self.name)

    @property
    def expires_messages(self) -> bool:
        return self.default_message_time_to_live < DEFAULT_TTL

    def to_json(self) -> bytes:
        return definition_json("subscription", self)

    @classmethod
    def from_json(cls, raw: bytes) -> SubscriptionProperties:
        return from_definition(cls, json.loads(raw))

    def policy(self, topic: TopicProperties, rules: list[RuleProperties]) -> Policy:
        """What the engine needs of this subscription: its settings, its
        topic's time to live and duplicate detection, its rules."""
        ttls = [_ms(t.default_message_time_to_live) for t in (self, topic) if t.expires_messages]
        return Policy(
            _ms(self.lock_duration), self.max_delivery_count,
            self.dead_lettering_on_message_expiration,
            _ms(topic.duplicate_detection_history_time_window)
            if topic.requires_duplicate_detection else 0,
            min(ttls) if ttls else 0,
            self.forward_to, self.forward_dead_lettered_messages_to,
            rules=tuple(r.spec() for r in rules), begin=tuple(self.begin_offsets),
            dead_letter_filter_errors=self.dead_lettering_on_filter_evaluation_exceptions,
            requires_session=self.requires_session, partitions=self.partition_count)
