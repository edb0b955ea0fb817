"""Messages as the azure-servicebus SDK shapes them."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from settlement.amqp import (
    AmqpAnnotatedMessage,
    AmqpMessageBodyType,
    AmqpMessageHeader,
    AmqpMessageProperties,
)
from topics import amqp_values
from topics.message_record import MAX_ID_LENGTH
from topics.sequence_numbers import split_sequence_number
from topics.times import epoch_ms, utc_from_ms

#: an application property value, as the SDK takes them (they come back with their types)
PropertyValue = str | bytes | int | float | bool | uuid.UUID | dt.datetime | None
PARTITION_KEY_ANNOTATION = "x-opt-partition-key"
SCHEDULED_ANNOTATION = "x-opt-scheduled-enqueue-time"


class ServiceBusMessageState(enum.IntEnum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class ServiceBusMessage:
    """A message to send, made from ``str`` (sent as UTF-8) or ``bytes``.

    As in the SDK, ``body`` gives the body's sections (one, of bytes):
    ``b"".join(message.body)`` or ``next(message.body)``; ``str(message)``
    is the text. A message sent as an :class:`AmqpAnnotatedMessage` with a
    VALUE body gives the value, with a SEQUENCE body a generator of its
    sections (``body_type`` says which). Application property values may be
    of the types of :data:`PropertyValue`; a datetime is kept to the
    millisecond and comes back in UTC."""

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
        #: DATA: ``_body`` is the body; VALUE, SEQUENCE: its JSON (topics.amqp_values)
        self._body_type = AmqpMessageBodyType.DATA
        for name, value in (("message_id", message_id), ("session_id", session_id),
                            ("partition_key", partition_key)):
            if value is not None and len(value) > MAX_ID_LENGTH:
                raise ValueError(f"{name} is {len(value)} characters; at most "
                                 f"{MAX_ID_LENGTH} are allowed")
        if session_id is not None and partition_key is not None and partition_key != session_id:
            raise ValueError("partition_key must equal session_id when both are set: a "
                             "session's messages are partitioned by its id")
        self.application_properties: dict[str, Any] = dict(application_properties or {})
        for key, prop in self.application_properties.items():
            if not isinstance(prop, amqp_values.PROPERTY_TYPES):
                raise TypeError(f"application property {key!r} is a {type(prop).__name__}; "
                                f"values must be {amqp_values.PROPERTY_TYPE_NAMES}")
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
    def body(self) -> Any:
        """DATA: the body's sections, a new generator on each access (the
        SDK's shape); VALUE: the value; SEQUENCE: a generator of the sections."""
        value = self._body_value()
        if self._body_type == AmqpMessageBodyType.VALUE:
            return value
        return (section for section in value)

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return self._body_type

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        """The message as AMQP sections (those a record keeps: see
        :mod:`settlement.amqp`), made anew on each access: changing it does
        not change the message."""
        properties = AmqpMessageProperties(
            message_id=self.message_id, to=self.to, subject=self.subject,
            reply_to=self.reply_to, correlation_id=self.correlation_id,
            content_type=self.content_type, group_id=self.session_id,
            reply_to_group_id=self.reply_to_session_id)
        ttl = self.time_to_live
        header = AmqpMessageHeader(time_to_live=None if ttl is None else ttl // _MS)
        return AmqpAnnotatedMessage(
            **{f"{self._body_type}_body": self._body_value()}, header=header,
            properties=properties, application_properties=dict(self.application_properties),
            annotations=self._annotations())

    def _body_value(self) -> Any:
        """The body as the AmqpAnnotatedMessage of its type takes it."""
        if self._body_type == AmqpMessageBodyType.DATA:
            return [self._body]
        return amqp_values.loads(self._body)

    def _annotations(self) -> dict[str, Any]:
        due = self.scheduled_enqueue_time_utc
        found = {PARTITION_KEY_ANNOTATION: self.partition_key,
                 SCHEDULED_ANNOTATION: None if due is None else epoch_ms(due)}
        return {key: value for key, value in found.items() if value is not None}

    def __str__(self) -> str:
        if self._body_type == AmqpMessageBodyType.DATA:
            return self._body.decode("utf-8", errors="replace")
        return str(self.raw_amqp_message)

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

    # What a received message does not carry is read from these class-level
    # defaults: the constructor stores only what it is given. One is built for
    # every record received, and thirty assignments each time were a third of
    # that (decoding a record and building its message: 11.5 -> 8.6 us).
    session_id: str | None = None
    message_id: str | None = None
    scheduled_enqueue_time_utc: dt.datetime | None = None
    time_to_live: dt.timedelta | None = None
    content_type: str | None = None
    correlation_id: str | None = None
    subject: str | None = None
    partition_key: str | None = None
    to: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    lock_token: str | None = None
    locked_until_utc: dt.datetime | None = None
    delivery_count: int = 0
    #: the record's log timestamp (ms): :attr:`enqueued_time_utc` is made
    #: from it when read, and a settlement reports it as it is
    _enqueued_ms: int | None = None
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None
    dead_letter_source: str | None = None
    state: ServiceBusMessageState = ServiceBusMessageState.ACTIVE
    malformed_reason: str | None = None
    #: set by AutoLockRenewer when it stopped renewing this message's lock
    auto_renew_error: Exception | None = None
    _body_type: AmqpMessageBodyType = AmqpMessageBodyType.DATA
    _settled: bool = False
    _receiver: Any = None
    #: the lock token as the engine granted it, and whether a settlement
    #: of that lock was sent: only the first, with that token, may be
    #: final without the engine's answer (docs/settlement-by-log.md)
    _granted_token: str | None = None
    _lock_spent: bool = False
    #: the application properties as the record gave them, until first read
    _decoded_properties: dict[str, Any] | None = None
    _application_properties: dict[str, Any] | None = None

    def __init__(self, body: bytes, **kwargs: Any) -> None:
        # The record was checked when it was decoded: no second validation of
        # every field, which would cost more than decoding on batch receives.
        # Set one by one, never through self.__dict__: CPython keeps the
        # attributes in the object until its __dict__ is asked for, and a
        # __dict__ made is one more object per message for the garbage
        # collector (counted after a receive of 1,000: 2 objects a message
        # -> 1). It does so for the first 30 attribute names a class's
        # instances are given (CPython 3.11's shared keys): the library gives
        # a received message at most 30, those declared above with
        # sequence_number and _body.
        if "body_type" in kwargs:
            self._body_type = kwargs.pop("body_type")
        decoded = kwargs.pop("application_properties", None)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._body = body
        if decoded:
            self._decoded_properties = decoded
        self._granted_token = kwargs.get("lock_token")
        self.sequence_number: int

    @property
    def enqueued_time_utc(self) -> dt.datetime | None:
        """When the broker appended the message's record (its log timestamp).
        Made when read: a datetime made for every message received, and its
        milliseconds again for every settlement, were 4 % of the client's
        time in a receive 1,000 + complete_messages loop (py-spy --gil)."""
        return utc_from_ms(self._enqueued_ms)

    @property
    def enqueued_sequence_number(self) -> int:
        """The sequence number the message was enqueued with: its own (a
        message is never enqueued again under another)."""
        return self.sequence_number

    def _deliver(self, **delivery: Any) -> None:
        """Set what the engine's grant says of this delivery (lock token, lock
        end, delivery count...) on a message built from its record before the
        grant came (a receive's read-ahead)."""
        for name, value in delivery.items():
            setattr(self, name, value)
        self._granted_token = self.lock_token

    @property
    def application_properties(self) -> dict[str, Any]:
        """The message's application properties (:class:`ReceivedProperties`),
        made when first read: most applications never read most messages'.
        Made for every message received, they were one object in five that
        the garbage collector kept walking while an application held its
        batch (a harness of receive 1,000 + complete_messages on Apache
        Kafka: the client's collections took 80-110 ms of a 0.5 s drain of
        20,000 messages, full ones 50-84 ms)."""
        if self._application_properties is None:
            self._application_properties = ReceivedProperties(self._decoded_properties or {})
            self._decoded_properties = None
        return self._application_properties

    @application_properties.setter
    def application_properties(self, value: dict[str, Any]) -> None:
        self._application_properties = value

    def _annotations(self) -> dict[str, Any]:
        received = {"x-opt-sequence-number": self.sequence_number,
                    "x-opt-enqueued-time": self.enqueued_time_utc,
                    "x-opt-locked-until": self.locked_until_utc}
        return {**super()._annotations(),
                **{key: value if isinstance(value, int) else epoch_ms(value)
                   for key, value in received.items() if value is not None}}

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        message = super().raw_amqp_message
        if message.header is not None:
            message.header.delivery_count = self.delivery_count
        return message

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


def copy_message(message: ServiceBusMessage,
                 extra_properties: dict[str, PropertyValue] | None = None) -> ServiceBusMessage:
    """A new message with the body, id and properties of ``message``."""
    properties = {**(message.application_properties or {}), **(extra_properties or {})}
    copy = ServiceBusMessage(
        message._body, application_properties=properties or None,
        session_id=message.session_id, message_id=message.message_id,
        content_type=message.content_type, correlation_id=message.correlation_id,
        subject=message.subject, partition_key=message.partition_key, to=message.to,
        reply_to=message.reply_to, reply_to_session_id=message.reply_to_session_id,
        time_to_live=message.time_to_live)
    copy._body_type = message._body_type
    return copy


#: what a sender sends: the SDK's senders take both
Sendable = ServiceBusMessage | AmqpAnnotatedMessage


def sendable_list(messages: Sendable | Iterable[Sendable]) -> list[ServiceBusMessage]:
    """One message or many as the ServiceBusMessages they are sent as."""
    listed = [messages] if isinstance(messages, Sendable) else list(messages)
    return [sendable(m) for m in listed]


def sendable(message: Sendable) -> ServiceBusMessage:
    """``message``, an AmqpAnnotatedMessage as the ServiceBusMessage it is
    sent as; anything else as it is, for the sender to refuse."""
    if not isinstance(message, AmqpAnnotatedMessage):
        return message
    properties = message.properties or AmqpMessageProperties()
    annotations = {_text(key): value for key, value in (message.annotations or {}).items()}
    ttl = message.header.time_to_live if message.header is not None else None
    due = annotations.get(SCHEDULED_ANNOTATION)
    converted = ServiceBusMessage(
        b"".join(message.body) if message.body_type == AmqpMessageBodyType.DATA else b"",
        application_properties={_text(key): value for key, value
                                in (message.application_properties or {}).items()},
        message_id=_text(properties.message_id), to=_text(properties.to),
        subject=_text(properties.subject), reply_to=_text(properties.reply_to),
        correlation_id=_text(properties.correlation_id),
        content_type=_text(properties.content_type), session_id=_text(properties.group_id),
        reply_to_session_id=_text(properties.reply_to_group_id),
        partition_key=_text(annotations.get(PARTITION_KEY_ANNOTATION)),
        time_to_live=None if ttl is None else dt.timedelta(milliseconds=ttl),
        scheduled_enqueue_time_utc=utc_from_ms(due) if isinstance(due, int) else due)
    if message.body_type != AmqpMessageBodyType.DATA:
        converted._body = amqp_values.dumps(
            message.body if message.body_type == AmqpMessageBodyType.VALUE
            else list(message.body), f"the {message.body_type} body")
        converted._body_type = message.body_type
    return converted


def _text(value: Any) -> Any:
    """An AMQP string, symbol, binary or UUID field as the str a record holds."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return None if value is None else str(value)


_MS = dt.timedelta(milliseconds=1)
