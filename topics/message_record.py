"""Wire format of an entity's message log: the only module that knows the
headers of a message record. See ``docs/wire-format.md`` for producers that
are not this library.

A message is one Kafka record on its queue's log ``NS.queue.QUEUE`` or its
topic's log ``NS.topic.TOPIC`` (the same format for both):

* value: the body, raw bytes;
* key: ``partition_key``, else ``session_id``, else ``message_id`` (UTF-8), else none;
* timestamp: the enqueued time;
* headers (all optional, UTF-8): ``message-id``, ``correlation-id``,
  ``content-type``, ``subject``, ``reply-to``, ``reply-to-session-id``, ``to``,
  ``session-id``, ``partition-key``, ``time-to-live-ms`` (decimal integer),
  ``scheduled-enqueue-time-ms`` (decimal epoch milliseconds),
  ``application-properties`` (a JSON object; bytes, UUID and datetime
  values tagged as :mod:`topics.amqp_values` says) and ``body-type``
  (``value`` or ``sequence``: the value is then the JSON of an AMQP VALUE or
  SEQUENCE body, tagged the same way; absent or ``data``: raw bytes).

A client paired with a secondary namespace adds ``replay-id`` (a random
hex id per message, kept when the message is moved from a backlog queue),
which receivers ignore; see :mod:`settlement.pairing`. The engine counts the
hops of a forwarded copy in ``transfer-hop-count``.

The sequence number of a message is ``(partition << 40 | offset) + 1``
(:mod:`topics.sequence_numbers`): it names the record, so a deferred message
is fetched by it. The client turns a :class:`MessageRecord` into the SDK's
message classes (:mod:`settlement.message_records`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from topics import amqp_values
from topics.sequence_numbers import sequence_number

MAX_HEADERS_BYTES = 64 * 1024       # all headers and application properties together
MAX_PROPERTY_BYTES = 32 * 1024      # one application property
#: most characters of a message id, session id or partition key
MAX_ID_LENGTH = 128
MALFORMED = "MalformedMessage"
HEADER_SIZE_EXCEEDED = "HeaderSizeExceeded"

APPLICATION_PROPERTIES = "application-properties"
TIME_TO_LIVE = "time-to-live-ms"
SCHEDULED_ENQUEUE_TIME = "scheduled-enqueue-time-ms"
REPLAY_ID = "replay-id"
HOP_COUNT = "transfer-hop-count"
BODY_TYPE = "body-type"
#: the ``body-type`` of a VALUE and a SEQUENCE body (AmqpMessageBodyType's values)
VALUE_BODY, SEQUENCE_BODY = "value", "sequence"
_DATA_BODY = "data"
#: text header -> the MessageRecord field it fills, in the order a record carries them
_TEXT_HEADERS = {name: name.replace("-", "_") for name in (
    "message-id", "correlation-id", "content-type", "subject", "reply-to",
    "reply-to-session-id", "to", "session-id", "partition-key")}
#: time header -> the MessageRecord field it fills
_TIME_HEADERS = {TIME_TO_LIVE: "time_to_live_ms",
                 SCHEDULED_ENQUEUE_TIME: "scheduled_enqueue_time_ms"}
_ID_HEADERS = frozenset({"message-id", "session-id", "partition-key"})
_KNOWN = frozenset({*_TEXT_HEADERS, *_TIME_HEADERS, APPLICATION_PROPERTIES, BODY_TYPE})
#: headers the log scanner reads (of every record of a scanned entity)
_SCANNED = ("message-id", TIME_TO_LIVE, SCHEDULED_ENQUEUE_TIME, "session-id")
_TIMED = frozenset({TIME_TO_LIVE, SCHEDULED_ENQUEUE_TIME})

#: a record's headers as confluent-kafka types them: a consumed record's are a
#: list of (name, bytes or None); the types also allow str values and a dict
Headers = (Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]]
           | None)
#: headers to produce
HeaderList = list[tuple[str, str | bytes | None]]
#: ``(key, value, headers)`` of a record to produce
Encoded = tuple[bytes | None, bytes, list[tuple[str, bytes]]]


@dataclass(frozen=True)
class MessageRecord:
    """What a message record carries besides its position and timestamp."""

    body: bytes = b""
    message_id: str | None = None
    correlation_id: str | None = None
    content_type: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    time_to_live_ms: int | None = None
    scheduled_enqueue_time_ms: int | None = None
    application_properties: dict[str, Any] | None = None
    #: ``VALUE_BODY`` or ``SEQUENCE_BODY`` when ``body`` is the JSON of such
    #: a body; None for a DATA body
    body_type: str | None = None


class MalformedRecord(ValueError):
    """A record in an entity log that does not follow the wire format;
    ``reason`` is the dead-letter reason it gets."""

    def __init__(self, message: str, reason: str = MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason


class RecordTooLarge(ValueError):
    """A message whose headers or one application property are larger than
    a record may carry (the client raises MessageSizeExceededError)."""


class Decoded(NamedTuple):
    body: bytes
    #: the MessageRecord fields the record's headers give, by field name
    fields: dict[str, Any]
    #: why some headers were left out (a lenient decode only), else None
    malformed: str | None


def encode(record: MessageRecord) -> Encoded:
    """``(key, value, headers)`` of the Kafka record that carries ``record``;
    RecordTooLarge when its headers pass the limits."""
    headers = [(name, text.encode()) for name, field_name in _TEXT_HEADERS.items()
               if (text := getattr(record, field_name)) is not None]
    headers += [(name, str(ms).encode()) for name, field_name in _TIME_HEADERS.items()
                if (ms := getattr(record, field_name)) is not None]
    if record.application_properties:
        headers.append((APPLICATION_PROPERTIES, _properties_json(record.application_properties)))
    if record.body_type is not None:
        headers.append((BODY_TYPE, record.body_type.encode()))
    size = _headers_size(headers)
    if size > MAX_HEADERS_BYTES:
        raise RecordTooLarge(
            f"message {record.message_id or ''} has {size} bytes of headers and application "
            f"properties; at most {MAX_HEADERS_BYTES} are allowed: move data into the body")
    key = record.partition_key or record.session_id or record.message_id
    return (key.encode() if key else None), record.body, headers


def _properties_json(properties: dict[str, Any]) -> bytes:
    """The ``application-properties`` header; RecordTooLarge for a property
    over its limit, TypeError for a value of a type a record cannot carry."""
    encoded = {name: amqp_values.to_json(value, f"application property {name!r}")
               for name, value in properties.items()}
    for name, value in encoded.items():
        size = len(name.encode()) + len(json.dumps(value).encode())
        if size > MAX_PROPERTY_BYTES:
            raise RecordTooLarge(
                f"application property {name!r} is {size} bytes; one property may have at "
                f"most {MAX_PROPERTY_BYTES}: move it into the body")
    return json.dumps(encoded, separators=(",", ":")).encode()


def _headers_size(headers: Headers) -> int:
    return sum(len(k.encode()) + len(v or b"") for k, v in _pairs(headers))


def stored_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """The bytes a record holds in its log: key, value and headers (what an
    entity's size, and so its quota, counts)."""
    return len(key or b"") + len(value or b"") + _headers_size(headers)


def _listed(headers: Headers) -> Sequence[tuple[str, str | bytes | None]]:
    """``(name, value)`` of each header; a consumed record's list as it is
    (checking it against ``Mapping`` took 0.4 us of every record the
    engine's scanner reads)."""
    if type(headers) is list:
        return headers
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())


def _pairs(headers: Headers) -> Iterator[tuple[str, bytes | None]]:
    """``(name, value)`` of each header, values as bytes."""
    for name, value in _listed(headers):
        yield name, value.encode() if isinstance(value, str) else value


def decode(value: bytes | None, headers: Headers, *, lenient: bool = False) -> Decoded:
    """What a record carries: the :class:`MessageRecord` fields its headers
    give (no others: a reader applies its own defaults), in one pass over
    the headers. Raise MalformedRecord for a record that breaks the format,
    unless ``lenient`` (then the unreadable headers are left out, the body
    is kept as DATA, and ``malformed`` says why, for the dead-letter
    sub-queue). Not a MessageRecord: receivers build one message per record,
    and the record between (a frozen dataclass of 14 fields) cost a fifth of
    that."""
    fields: dict[str, Any] = {}
    error: MalformedRecord | None = None
    size = 0
    for name, raw in _pairs(headers):
        size += len(name.encode()) + len(raw or b"")
        if name not in _KNOWN:
            continue  # other producers' headers are theirs; ignore them
        try:
            fields.update(_decode_header(name, raw))
        except MalformedRecord as exc:
            error = error or exc
    if not lenient:
        # The size first: the record's one reason when it has several.
        if size > MAX_HEADERS_BYTES:
            raise MalformedRecord(f"the record has {size} bytes of headers; at most "
                                  f"{MAX_HEADERS_BYTES} are allowed", HEADER_SIZE_EXCEEDED)
        if error is not None:
            raise error
    malformed = None if error is None else str(error)
    body = value or b""
    body_type = fields.get("body_type")
    if body_type is not None:
        try:
            _check_body(body, body_type)
        except MalformedRecord as exc:
            if not lenient:
                raise
            malformed = malformed or str(exc)
            fields["body_type"] = None
    return Decoded(body, fields, malformed)


def _check_body(body: bytes, body_type: str) -> None:
    """MalformedRecord unless ``body`` is the JSON its ``body-type`` says."""
    try:
        value = amqp_values.loads(body)
    except ValueError as exc:
        raise MalformedRecord(f"a {body_type} body must be JSON as "
                              f"docs/wire-format.md says: {exc}") from None
    if body_type == SEQUENCE_BODY and not (
            isinstance(value, list) and all(isinstance(section, list) for section in value)):
        raise MalformedRecord("a sequence body must be a JSON array of arrays (its sections)")


def _decode_header(name: str, raw: bytes | None) -> dict[str, Any]:
    """The MessageRecord field a header fills: ``{field: value}``."""
    try:
        text = (raw or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRecord(f"header {name!r} is not UTF-8") from None
    if name in _TEXT_HEADERS:
        if name in _ID_HEADERS and len(text) > MAX_ID_LENGTH:
            raise MalformedRecord(f"header {name!r} is {len(text)} characters; at most "
                                  f"{MAX_ID_LENGTH} are allowed")
        return {_TEXT_HEADERS[name]: text}
    if name == APPLICATION_PROPERTIES:
        try:
            props = amqp_values.loads(text)
        except ValueError as exc:
            raise MalformedRecord(f"header {name!r} is not JSON as docs/wire-format.md "
                                  f"says: {exc}") from None
        if not isinstance(props, dict):
            raise MalformedRecord(f"header {name!r} must be a JSON object")
        return {"application_properties": props}
    if name == BODY_TYPE:
        if text not in (VALUE_BODY, SEQUENCE_BODY, _DATA_BODY):
            raise MalformedRecord(f"header {name!r} must be {VALUE_BODY!r}, "
                                  f"{SEQUENCE_BODY!r} or {_DATA_BODY!r}, got {text[:40]!r}")
        return {"body_type": None if text == _DATA_BODY else text}
    if not text.isdigit():
        raise MalformedRecord(f"header {name!r} must be a decimal integer, got {text[:40]!r}")
    return {_TIME_HEADERS[name]: int(text)}


#: header -> the system property a rule filter names it by (``sys.<name>``)
_SYSTEM_NAMES = {"message-id": "messageid", "correlation-id": "correlationid",
                 "content-type": "contenttype", "subject": "label", "reply-to": "replyto",
                 "reply-to-session-id": "replytosessionid", "to": "to",
                 "session-id": "sessionid", "partition-key": "partitionkey",
                 TIME_TO_LIVE: "timetolive", SCHEDULED_ENQUEUE_TIME: "scheduledenqueuetimeutc"}


def filter_properties(value: bytes | None, headers: Headers,
                      timestamp_ms: int | None, partition: int, offset: int
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(system, user)`` properties of a record as subscription rules see
    them: system properties by their lower-case SQL names (``label`` is the
    subject, under both names; times in milliseconds), application
    properties as sent. Raise MalformedRecord for a record that breaks the
    format (the receiver dead-letters it)."""
    system: dict[str, Any] = {"sequencenumber": sequence_number(partition, offset),
                              "enqueuedtimeutc": timestamp_ms,
                              "size": len(value or b""), "label": None}
    user: dict[str, Any] = {}
    for name, raw in _pairs(headers):
        if name in _SYSTEM_NAMES:
            (decoded,) = _decode_header(name, raw).values()
            system[_SYSTEM_NAMES[name]] = decoded
        elif name == APPLICATION_PROPERTIES:
            user = _decode_header(name, raw)["application_properties"]
    system["subject"] = system["label"]
    return system, user


@dataclass(frozen=True)
class ScannedHeaders:
    """What the engine's log scanner reads of a record, leniently: a header
    it cannot read is left out (the receiver dead-letters the record); a
    time that is not a decimal integer reads as 0, none."""

    message_id: str | None = None
    session_id: str | None = None
    time_to_live_ms: int = 0
    scheduled_enqueue_time_ms: int = 0


def raw_application_properties(headers: Headers) -> str | bytes | None:
    """The ``application-properties`` header as the record has it, unread
    (records with the same one have the same application properties)."""
    for name, value in _listed(headers):
        if name == APPLICATION_PROPERTIES:
            return value
    return None


def may_be_timed(headers: Headers) -> bool:
    """Whether the record has a header that could give it a time to live or
    a schedule, by the headers' names alone (cheaper than reading them)."""
    for name, _ in _listed(headers):
        if name in _TIMED:
            return True
    return False


def scanned_headers(headers: Headers) -> ScannedHeaders:
    found: dict[str, str] = {}
    for name, value in _pairs(headers):
        if name in _SCANNED:
            try:
                found[name] = (value or b"").decode("utf-8")
            except UnicodeDecodeError:
                continue  # the receiver dead-letters malformed records
    return ScannedHeaders(found.get("message-id"), found.get("session-id"),
                          _int(found.get(TIME_TO_LIVE)), _int(found.get(SCHEDULED_ENQUEUE_TIME)))


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def hop_count(headers: Headers) -> int:
    """How many times the engine forwarded this record's message."""
    for name, value in _pairs(headers):
        if name == HOP_COUNT and value and value.isdigit():
            return int(value)
    return 0


def forwarded_headers(headers: Headers, hops: int,
                      extra_properties: dict[str, str | None] | None = None,
                      properties: dict[str, Any] | None = None) -> HeaderList:
    """The headers of a forwarded copy: ``hops`` counted, ``properties``
    (what a subscription's rule actions made of them) as its application
    properties, and ``extra_properties`` (a dead letter's reason and
    description) added to them. RecordTooLarge when ``properties`` pass the
    limits."""
    copied: HeaderList = [(k, v) for k, v in _pairs(headers) if k != HOP_COUNT]
    if properties is not None:
        copied = [(k, v) for k, v in copied if k != APPLICATION_PROPERTIES]
        if properties:
            copied.append((APPLICATION_PROPERTIES, _properties_json(properties)))
    if extra_properties:
        copied = _with_properties(copied, extra_properties)
    copied.append((HOP_COUNT, str(hops).encode()))
    return copied


def _with_properties(headers: HeaderList, extra: dict[str, str | None]) -> HeaderList:
    props: dict[str, object] = {}
    rest = []
    for name, value in headers:
        if name == APPLICATION_PROPERTIES:
            try:
                loaded = json.loads(value or b"{}")
                props = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                props = {}
        else:
            rest.append((name, value))
    props.update({k: v for k, v in extra.items() if v is not None})
    return [*rest, (APPLICATION_PROPERTIES, json.dumps(props).encode())]


def with_replay_id(encoded: Encoded, replay_id: str) -> Encoded:
    """A paired client's record: ``encoded`` with its replay id."""
    key, value, headers = encoded
    return key, value, [*headers, (REPLAY_ID, replay_id.encode())]


def replay_ids(headers: Headers) -> list[str]:
    """The replay ids a record carries (one, for a paired client's)."""
    return [value.decode() for name, value in _pairs(headers) if name == REPLAY_ID and value]
