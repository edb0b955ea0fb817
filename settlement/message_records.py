"""The SDK's messages as message records and back: a ServiceBusMessage to
send becomes a :class:`topics.message_record.MessageRecord`, a record read
becomes a ServiceBusReceivedMessage. The record format itself (headers,
limits, what is malformed) is :mod:`topics.message_record`'s.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from settlement.amqp import AmqpMessageBodyType
from settlement.exceptions import MessageSizeExceededError
from settlement.message import (
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
)
from topics import message_record
from topics.message_record import Encoded, Headers, MessageRecord
from topics.sequence_numbers import sequence_number
from topics.times import epoch_ms, utc_from_ms


def _ms(value: dt.datetime | dt.timedelta) -> int:
    if isinstance(value, dt.timedelta):
        return int(value.total_seconds() * 1000)
    return epoch_ms(value)


def to_record(message: ServiceBusMessage) -> MessageRecord:
    ttl, due = message.time_to_live, message.scheduled_enqueue_time_utc
    return MessageRecord(
        message._body, message_id=message.message_id, correlation_id=message.correlation_id,
        content_type=message.content_type, subject=message.subject, reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id, to=message.to,
        session_id=message.session_id, partition_key=message.partition_key,
        time_to_live_ms=None if ttl is None else _ms(ttl),
        scheduled_enqueue_time_ms=None if due is None else _ms(due),
        application_properties=message.application_properties,
        body_type=None if message.body_type == AmqpMessageBodyType.DATA
        else message.body_type.value)


def encode(message: ServiceBusMessage) -> Encoded:
    """``(key, value, headers)`` of the record that carries ``message``."""
    try:
        return message_record.encode(to_record(message))
    except message_record.RecordTooLarge as exc:
        raise MessageSizeExceededError(str(exc)) from None


def record_size(message: ServiceBusMessage) -> int:
    key, value, headers = encode(message)
    return len(key or b"") + len(value) + sum(len(k) + len(v) for k, v in headers)


def decode(value: bytes | None, headers: Headers, timestamp_ms: int | None,
           partition: int, offset: int, *, lenient: bool = False, **delivery: Any
           ) -> ServiceBusReceivedMessage:
    """The received message a record carries; raise MalformedRecord for a
    record that breaks the format, unless ``lenient`` (then the body is kept
    and the unreadable headers are left out, for the dead-letter sub-queue)."""
    return received(contents(value, headers, timestamp_ms, partition, offset,
                             lenient=lenient), **delivery)


#: what a record holds for its received message: the body and the fields
Contents = tuple[bytes, dict[str, Any]]


def received(read: Contents, **delivery: Any) -> ServiceBusReceivedMessage:
    """The received message of a record's :func:`contents` and its delivery
    (lock token, lock end, delivery count...), which the engine's grant gives."""
    body, given = read
    return ServiceBusReceivedMessage(body, **given, **delivery)


def contents(value: bytes | None, headers: Headers, timestamp_ms: int | None,
             partition: int, offset: int, *, lenient: bool = False) -> Contents:
    """What the record holds for its message, as :func:`decode` says; its
    delivery is not known yet."""
    body, given, malformed = message_record.decode(value, headers, lenient=lenient)
    # Only what the record holds: the message's class gives the rest. The
    # text fields have the message's names already.
    ttl = given.pop("time_to_live_ms", None)
    if ttl is not None:
        given["time_to_live"] = dt.timedelta(milliseconds=ttl)
    due = given.pop("scheduled_enqueue_time_ms", None)
    if due is not None:
        given["scheduled_enqueue_time_utc"] = utc_from_ms(due)
    if given.get("application_properties") == {}:  # none: the class's default
        del given["application_properties"]
    body_type = given.pop("body_type", None)
    if body_type is not None:
        given["body_type"] = AmqpMessageBodyType(body_type)
    if malformed is not None:
        given["malformed_reason"] = malformed
    given["sequence_number"] = sequence_number(partition, offset)
    given["_enqueued_ms"] = timestamp_ms
    return body, given


STATES = {"active": ServiceBusMessageState.ACTIVE, "deadletter": ServiceBusMessageState.ACTIVE,
          "deferred": ServiceBusMessageState.DEFERRED,
          "scheduled": ServiceBusMessageState.SCHEDULED,
          "transferdeadletter": ServiceBusMessageState.ACTIVE}
