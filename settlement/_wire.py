"""Wire format of an entity's message log: the only module that reads or
writes message records. See ``docs/wire-format.md`` for producers that are
not this library.

A message is one Kafka record on its queue's log ``NS.queue.QUEUE`` or its
topic's log ``NS.topic.TOPIC`` (the same format for both):

* value: the body, raw bytes;
* key: ``partition_key``, else ``session_id``, else ``message_id`` (UTF-8), else none;
* timestamp: the enqueued time;
* headers (all optional, UTF-8): ``message-id``, ``correlation-id``,
  ``content-type``, ``subject``, ``reply-to``, ``reply-to-session-id``, ``to``,
  ``session-id``, ``partition-key``, ``time-to-live-ms`` (decimal integer),
  ``scheduled-enqueue-time-ms`` (decimal epoch milliseconds) and
  ``application-properties`` (a JSON object of str/int/float/bool/null).

A client paired with a secondary namespace adds ``replay-id`` (a random
hex id per message, kept when the message is moved from a backlog queue),
which receivers ignore; see :mod:`settlement.pairing`.

The sequence number of a message is ``(partition << 40 | offset) + 1``
(:mod:`settlement._sequence`): it names the record, so a deferred message is fetched by it.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from settlement._sequence import sequence_number
from settlement.exceptions import MessageSizeExceededError
from settlement.message import (
    MAX_ID_LENGTH,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
)

MAX_HEADERS_BYTES = 64 * 1024       # all headers and application properties together
MAX_PROPERTY_BYTES = 32 * 1024      # one application property
MALFORMED = "MalformedMessage"
REPLAY_ID = "replay-id"
HEADER_SIZE_EXCEEDED = "HeaderSizeExceeded"
_TEXT_HEADERS = ("message-id", "correlation-id", "content-type", "subject", "reply-to",
                 "reply-to-session-id", "to", "session-id", "partition-key")
_ID_HEADERS = frozenset({"message-id", "session-id", "partition-key"})
_KNOWN = frozenset({*_TEXT_HEADERS, "time-to-live-ms", "scheduled-enqueue-time-ms",
                    "application-properties"})


class MalformedRecord(ValueError):
    """A record in an entity log that does not follow the wire format;
    ``reason`` is the dead-letter reason it gets."""

    def __init__(self, message: str, reason: str = MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason


def as_utc(value: dt.datetime) -> dt.datetime:
    """A naive datetime is taken as UTC, as the SDK does."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


def epoch_ms(value: dt.datetime) -> int:
    return int(as_utc(value).timestamp() * 1000)


def _ms(value: dt.datetime | dt.timedelta) -> int:
    if isinstance(value, dt.timedelta):
        return int(value.total_seconds() * 1000)
    return epoch_ms(value)


def encode(message: ServiceBusMessage) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of the record that carries ``message``."""
    text = {
        "message-id": message.message_id, "correlation-id": message.correlation_id,
        "content-type": message.content_type, "subject": message.subject,
        "reply-to": message.reply_to, "reply-to-session-id": message.reply_to_session_id,
        "to": message.to, "session-id": message.session_id,
        "partition-key": message.partition_key,
    }
    headers = [(k, v.encode()) for k, v in text.items() if v is not None]
    if message.time_to_live is not None:
        headers.append(("time-to-live-ms", str(_ms(message.time_to_live)).encode()))
    if message.scheduled_enqueue_time_utc is not None:
        headers.append(("scheduled-enqueue-time-ms",
                        str(_ms(message.scheduled_enqueue_time_utc)).encode()))
    if message.application_properties:
        _check_property_sizes(message.application_properties)
        headers.append(("application-properties",
                        json.dumps(message.application_properties,
                                   separators=(",", ":")).encode()))
    size = _headers_size(headers)
    if size > MAX_HEADERS_BYTES:
        raise MessageSizeExceededError(
            f"message {message.message_id or ''} has {size} bytes of headers and application "
            f"properties; at most {MAX_HEADERS_BYTES} are allowed: move data into the body")
    key = message.partition_key or message.session_id or message.message_id
    return (key.encode() if key else None), message._body, headers


def _check_property_sizes(properties: dict[str, Any]) -> None:
    for name, value in properties.items():
        size = len(name.encode()) + len(json.dumps(value).encode())
        if size > MAX_PROPERTY_BYTES:
            raise MessageSizeExceededError(
                f"application property {name!r} is {size} bytes; one property may have at "
                f"most {MAX_PROPERTY_BYTES}: move it into the body")


def _headers_size(headers: list[tuple[str, bytes | None]]) -> int:
    return sum(len(k.encode()) + len(v or b"") for k, v in headers)


def record_size(message: ServiceBusMessage) -> int:
    key, value, headers = encode(message)
    return len(key or b"") + len(value) + sum(len(k) + len(v) for k, v in headers)


def utc_from_ms(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def decode(value: bytes | None, headers: list[tuple[str, bytes | None]] | None,
           timestamp_ms: int | None, partition: int, offset: int, *,
           lenient: bool = False, **delivery: Any) -> ServiceBusReceivedMessage:
    """The received message a record carries; raise MalformedRecord for a
    record that breaks the format, unless ``lenient`` (then the body is kept
    and the unreadable headers are left out, for the dead-letter sub-queue)."""
    fields: dict[str, Any] = {}
    malformed: str | None = None
    size = _headers_size(headers or [])
    if size > MAX_HEADERS_BYTES and not lenient:
        raise MalformedRecord(f"the record has {size} bytes of headers; at most "
                              f"{MAX_HEADERS_BYTES} are allowed", HEADER_SIZE_EXCEEDED)
    for name, raw in headers or []:
        try:
            fields.update(_decode_header(name, raw))
        except MalformedRecord as exc:
            if not lenient:
                raise
            malformed = malformed or str(exc)
    common = {"sequence_number": sequence_number(partition, offset),
              "enqueued_time_utc": utc_from_ms(timestamp_ms), **delivery}
    return ServiceBusReceivedMessage(value or b"", **fields, malformed_reason=malformed,
                                     **common)


def _decode_header(name: str, raw: bytes | None) -> dict[str, Any]:
    if name not in _KNOWN:
        return {}  # other producers' headers are theirs; ignore them
    try:
        text = (raw or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRecord(f"header {name!r} is not UTF-8") from None
    if name in _TEXT_HEADERS:
        if name in _ID_HEADERS and len(text) > MAX_ID_LENGTH:
            raise MalformedRecord(f"header {name!r} is {len(text)} characters; at most "
                                  f"{MAX_ID_LENGTH} are allowed")
        return {name.replace("-", "_"): text}
    if name == "application-properties":
        try:
            props = json.loads(text)
        except ValueError:
            raise MalformedRecord("header 'application-properties' is not JSON") from None
        if not isinstance(props, dict):
            raise MalformedRecord("header 'application-properties' must be a JSON object")
        return {"application_properties": props}
    if not text.isdigit():
        raise MalformedRecord(f"header {name!r} must be a decimal integer, got {text[:40]!r}")
    if name == "time-to-live-ms":
        return {"time_to_live": dt.timedelta(milliseconds=int(text))}
    return {"scheduled_enqueue_time_utc": utc_from_ms(int(text))}


#: header -> the system property a rule filter names it by (``sys.<name>``)
_SYSTEM_NAMES = {"message-id": "messageid", "correlation-id": "correlationid",
                 "content-type": "contenttype", "subject": "label", "reply-to": "replyto",
                 "reply-to-session-id": "replytosessionid", "to": "to",
                 "session-id": "sessionid", "partition-key": "partitionkey"}


def filter_properties(value: bytes | None, headers: list[tuple[str, bytes | None]] | None,
                      timestamp_ms: int | None, partition: int, offset: int
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(system, user)`` properties of a record as subscription rules see
    them: system properties by their lower-case SQL names (``label`` is the
    subject), application properties as sent. Raise MalformedRecord for a
    record that breaks the format (the receiver dead-letters it)."""
    system: dict[str, Any] = {"sequencenumber": sequence_number(partition, offset),
                              "enqueuedtimeutc": timestamp_ms,
                              "size": len(value or b"")}
    user: dict[str, Any] = {}
    for name, raw in headers or []:
        if name in _SYSTEM_NAMES:
            system[_SYSTEM_NAMES[name]] = _decode_header(name, raw)[name.replace("-", "_")]
        elif name == "application-properties":
            user = _decode_header(name, raw)["application_properties"]
        elif name == "time-to-live-ms":
            system["timetolive"] = int(_decode_header(name, raw)["time_to_live"]
                                       .total_seconds() * 1000)
        elif name == "scheduled-enqueue-time-ms":
            system["scheduledenqueuetimeutc"] = epoch_ms(
                _decode_header(name, raw)["scheduled_enqueue_time_utc"])
    system["subject"] = system.get("label")
    return system, user


STATES = {"active": ServiceBusMessageState.ACTIVE, "deadletter": ServiceBusMessageState.ACTIVE,
          "deferred": ServiceBusMessageState.DEFERRED,
          "scheduled": ServiceBusMessageState.SCHEDULED,
          "transferdeadletter": ServiceBusMessageState.ACTIVE}
