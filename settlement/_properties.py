"""Queue properties and runtime properties, as ``azure.servicebus.management``,
and the JSON form every entity definition takes on the entities topic."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from topics.commands import Policy

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


def definition_json(kind: str, definition: Any) -> bytes:
    """A definition dataclass as stored: durations in seconds, times in ISO
    8601, and its ``kind`` (queue, topic, subscription or rule)."""
    body: dict[str, Any] = {"kind": kind}
    for key, value in asdict(definition).items():
        if isinstance(value, dt.timedelta):
            value = value.total_seconds()
        elif isinstance(value, dt.datetime):
            value = value.isoformat()
        body[key] = value
    return json.dumps(body).encode()


def from_definition(cls: Any, body: Any) -> Any:
    """The dataclass ``cls`` from its stored form; fields it does not know
    (written by a newer version) are left out. Anything malformed (not an
    object, a missing name, a field of the wrong type) raises ValueError:
    readers of the entities topic skip such a record and go on."""
    if not isinstance(body, dict):
        raise ValueError("a definition must be a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key not in fields:
            continue
        kind = str(fields[key].type)
        if "timedelta" in kind and isinstance(value, int | float):
            value = dt.timedelta(seconds=value)
        elif "datetime" in kind and isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        values[key] = value
    try:
        made = cls(**values)
    except TypeError as exc:
        raise ValueError(f"not a {cls.__name__}: {exc}") from None
    for field_ in dataclasses.fields(cls):
        value = getattr(made, field_.name)
        if not _of_type(value, str(field_.type)):
            raise ValueError(f"{cls.__name__}.{field_.name} is {value!r}, not {field_.type}")
    return made


def _of_type(value: Any, annotation: str) -> bool:
    """Whether a stored value fits a field's annotation (the few kinds
    definitions use)."""
    if value is None:
        return "None" in annotation
    base = annotation.split("|")[0].strip()
    expected: dict[str, type | tuple[type, ...]] = {
        "dt.timedelta": dt.timedelta, "dt.datetime": dt.datetime, "bool": bool, "str": str,
        "int": int, "list[int]": list}
    if base not in expected or not isinstance(value, expected[base]):
        return False
    if base == "int":
        return not isinstance(value, bool)
    if base == "list[int]":
        return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return True


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
