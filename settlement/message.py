"""Messages as the azure-servicebus SDK shapes them."""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterator, Mapping
from typing import Any

from settlement.amqp import AmqpMessageBodyType
from topics.message_record import MAX_ID_LENGTH
from topics.sequence_numbers import split_sequence_number

PropertyValue = str | int | float | bool | None


class ServiceBusMessageState(enum.IntEnum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class ServiceBusMessage:
    """A message to send, made from ``str`` (sent as UTF-8) or ``bytes``.

    As in the SDK, ``body`` gives the body's sections (one, of bytes):
    ``b"".join(message.body)`` or ``next(message.body)``; ``str(message)``
    is the text."""

    def __init__(
        self,
        body: str | bytes | None,
        *,
        application_properties: Mapping[str, PropertyValue] | None = None,
        session_id: str | None = None,
        message_id: str | None = None,
        scheduled_enqueue_time_utc: dt.datetime | None = None,
        time_to_live: dt.timedelta | None = None,
        content_type: str | None = None,
        correlation_id: str | None = None,
        subject: str | None = None,
        partition_key: str | None = None,
        to: str | None = None,
        reply_to: str | None = None,
        reply_to_session_id: str | None = None,
    ) -> None:
        if body is None:
            body = b""
        if not isinstance(body, str | bytes | bytearray | memoryview):
            raise TypeError(f"message body must be str or bytes, not {type(body).__name__}")
        self._body = body.encode() if isinstance(body, str) else bytes(body)
        for name, value in (("message_id", message_id), ("session_id", session_id),
                            ("partition_key", partition_key)):
            if value is not None and len(value) > MAX_ID_LENGTH:
                raise ValueError(f"{name} is {len(value)} characters; at most "
                                 f"{MAX_ID_LENGTH} are allowed")
        if session_id is not None and partition_key is not None and partition_key != session_id:
            raise ValueError("partition_key must equal session_id when both are set: a "
                             "session's messages are partitioned by its id")
        self.application_properties = dict(application_properties or {})
        try:
            json.dumps(self.application_properties)
        except (TypeError, ValueError) as exc:
            raise TypeError("application_properties values must be str, int, float, bool "
                            f"or None: {exc}") from None
        self.session_id = session_id
        self.message_id = message_id
        self.scheduled_enqueue_time_utc = scheduled_enqueue_time_utc
        self.time_to_live = time_to_live
        self.content_type = content_type
        self.correlation_id = correlation_id
        self.subject = subject
        self.partition_key = partition_key
        self.to = to
        self.reply_to = reply_to
        self.reply_to_session_id = reply_to_session_id

    @property
    def body(self) -> Iterator[bytes]:
        """The body's DATA sections, a new generator on each access (the SDK's shape)."""
        return (section for section in (self._body,))

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return AmqpMessageBodyType.DATA

    def __str__(self) -> str:
        return self._body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(message_id={self.message_id!r}, body={self._body[:40]!r})"


class ReceivedProperties(dict[str, Any]):
    """A received message's application properties, keyed by ``str`` as they
    were sent. Code written for azure-servicebus looks them up by ``bytes``
    (its AMQP decoder gives bytes keys and bytes strings, and the SDK's
    samples do ``props.get(b"Color").decode()``): looked up that way, a
    string value comes back as UTF-8 bytes, so both spellings port."""

    def __getitem__(self, key: str | bytes) -> Any:
        if isinstance(key, bytes):
            value = super().__getitem__(key.decode("utf-8", errors="replace"))
            return value.encode() if isinstance(value, str) else value
        return super().__getitem__(key)

    def get(self, key: str | bytes, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        if isinstance(key, bytes):
            key = key.decode("utf-8", errors="replace")
        return super().__contains__(key)


class ServiceBusReceivedMessage(ServiceBusMessage):
    """A received message; settle it through the receiver that received it."""

    def __init__(self, body: bytes, **kwargs: Any) -> None:
        # The record was checked when it was decoded: no second validation of
        # every field, which would cost more than decoding on batch receives.
        self._body = body
        for name in _SEND_FIELDS:
            setattr(self, name, kwargs.get(name))
        self.application_properties = ReceivedProperties(
            kwargs.get("application_properties") or {})
        self.lock_token: str | None = kwargs.get("lock_token")
        self.locked_until_utc: dt.datetime | None = kwargs.get("locked_until_utc")
        self.delivery_count: int = kwargs.get("delivery_count", 0)
        self.sequence_number: int = kwargs["sequence_number"]
        self.enqueued_sequence_number: int = self.sequence_number
        self.enqueued_time_utc: dt.datetime | None = kwargs.get("enqueued_time_utc")
        self.dead_letter_reason: str | None = kwargs.get("dead_letter_reason")
        self.dead_letter_error_description: str | None = kwargs.get("dead_letter_error_description")
        self.dead_letter_source: str | None = kwargs.get("dead_letter_source")
        self.state: ServiceBusMessageState = kwargs.get("state", ServiceBusMessageState.ACTIVE)
        self.malformed_reason: str | None = kwargs.get("malformed_reason")
        #: set by AutoLockRenewer when it stopped renewing this message's lock
        self.auto_renew_error: Exception | None = None
        self._settled = False
        self._receiver: Any = None
        #: the lock token as the engine granted it, and whether a settlement
        #: of that lock was sent: only the first, with that token, may be
        #: final without the engine's answer (docs/settlement-by-log.md)
        self._granted_token = self.lock_token
        self._lock_spent = False

    @property
    def expires_at_utc(self) -> dt.datetime | None:
        if self.time_to_live is None or self.enqueued_time_utc is None:
            return None
        return self.enqueued_time_utc + self.time_to_live

    @property
    def partition(self) -> int:
        return split_sequence_number(self.sequence_number)[0]

    @property
    def offset(self) -> int:
        return split_sequence_number(self.sequence_number)[1]

    def __repr__(self) -> str:
        return (f"ServiceBusReceivedMessage(sequence_number={self.sequence_number}, "
                f"message_id={self.message_id!r}, delivery_count={self.delivery_count})")


_SEND_FIELDS = frozenset({
    "application_properties", "session_id", "message_id", "scheduled_enqueue_time_utc",
    "time_to_live", "content_type", "correlation_id", "subject", "partition_key", "to",
    "reply_to", "reply_to_session_id",
})


def copy_message(message: ServiceBusMessage,
                 extra_properties: dict[str, PropertyValue] | None = None) -> ServiceBusMessage:
    """A new message with the body, id and properties of ``message``."""
    properties = {**(message.application_properties or {}), **(extra_properties or {})}
    return ServiceBusMessage(
        b"".join(message.body), application_properties=properties or None,
        session_id=message.session_id, message_id=message.message_id,
        content_type=message.content_type, correlation_id=message.correlation_id,
        subject=message.subject, partition_key=message.partition_key, to=message.to,
        reply_to=message.reply_to, reply_to_session_id=message.reply_to_session_id,
        time_to_live=message.time_to_live)
