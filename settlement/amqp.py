"""``azure.servicebus.amqp``: a message as AMQP sections, for code that sends
or reads VALUE and SEQUENCE bodies.

A record carries one body (``docs/wire-format.md``): a DATA body is the
record's bytes (several data sections arrive as one, their concatenation);
a VALUE or SEQUENCE body is JSON with the ``body-type`` header. Of the other
sections, what a record has a header for is kept: the properties
``message_id``, ``correlation_id``, ``content_type``, ``subject``, ``reply_to``,
``to``, ``group_id`` (the session id) and ``reply_to_group_id``; the header's
``time_to_live``; the annotations ``x-opt-partition-key`` and
``x-opt-scheduled-enqueue-time``; the application properties. The rest
(``user_id``, ``content_encoding``, ``creation_time``, ``absolute_expiry_time``,
``group_sequence``, ``durable``, ``priority``, ``first_acquirer``, other
annotations, delivery annotations and the footer) is not sent. A received
message's ``raw_amqp_message`` also has ``header.delivery_count`` and the
annotations ``x-opt-sequence-number``, ``x-opt-enqueued-time`` and
``x-opt-locked-until`` (epoch milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from azure.core import CaseInsensitiveEnumMeta


class AmqpMessageBodyType(StrEnum, metaclass=CaseInsensitiveEnumMeta):
    DATA = "data"
    SEQUENCE = "sequence"
    VALUE = "value"


@dataclass(kw_only=True)
class AmqpMessageHeader:
    """The AMQP header section; ``time_to_live`` is in milliseconds."""

    delivery_count: int | None = None
    time_to_live: int | None = None
    durable: bool | None = None
    first_acquirer: bool | None = None
    priority: int | None = None


@dataclass(kw_only=True)
class AmqpMessageProperties:
    """The AMQP properties section; times are epoch milliseconds."""

    message_id: Any = None
    user_id: str | bytes | None = None
    to: str | bytes | None = None
    subject: str | bytes | None = None
    reply_to: str | bytes | None = None
    correlation_id: Any = None
    content_type: str | bytes | None = None
    content_encoding: str | bytes | None = None
    creation_time: int | None = None
    absolute_expiry_time: int | None = None
    group_id: str | bytes | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | bytes | None = None


_NOT_GIVEN: Any = object()


class AmqpAnnotatedMessage:
    """A message made of AMQP sections. Give exactly one body:
    ``data_body`` (str, bytes or a list of them: data sections),
    ``value_body`` (one value: str, bytes, int, float, bool, None, uuid.UUID,
    datetime.datetime, or lists and maps of them) or
    ``sequence_body`` (a list of values, or a list of such lists: sequence
    sections). ``header`` and ``properties`` may be given as mappings."""

    def __init__(self, *, data_body: Any = _NOT_GIVEN, sequence_body: Any = _NOT_GIVEN,
                 value_body: Any = _NOT_GIVEN,
                 header: AmqpMessageHeader | Mapping[str, Any] | None = None,
                 footer: dict[Any, Any] | None = None,
                 properties: AmqpMessageProperties | Mapping[str, Any] | None = None,
                 application_properties: dict[Any, Any] | None = None,
                 annotations: dict[Any, Any] | None = None,
                 delivery_annotations: dict[Any, Any] | None = None,
                 encoding: str = "UTF-8") -> None:
        given = [body is not _NOT_GIVEN for body in (data_body, sequence_body, value_body)]
        if sum(given) != 1:
            raise ValueError("give exactly one of data_body, sequence_body or value_body "
                             "as the body of an AmqpAnnotatedMessage")
        self._encoding = encoding
        self._body: Any
        if data_body is not _NOT_GIVEN:
            sections = data_body if isinstance(data_body, list) else [data_body]
            self._body = [s.encode(encoding) if isinstance(s, str) else bytes(s)
                          for s in sections]
            self._body_type = AmqpMessageBodyType.DATA
        elif sequence_body is not _NOT_GIVEN:
            if not isinstance(sequence_body, list):
                raise TypeError("sequence_body must be a list (one section) or a list of "
                                f"lists (sections), not {type(sequence_body).__name__}")
            # as the SDK: a list of lists is the sections, any other list is one
            self._body = (sequence_body if sequence_body and all(
                isinstance(section, list) for section in sequence_body) else [sequence_body])
            self._body_type = AmqpMessageBodyType.SEQUENCE
        else:
            self._body = value_body
            self._body_type = AmqpMessageBodyType.VALUE
        self.header = AmqpMessageHeader(**header) if isinstance(header, Mapping) else header
        self.properties = (AmqpMessageProperties(**properties)
                           if isinstance(properties, Mapping) else properties)
        self.application_properties = application_properties
        self.annotations = annotations
        self.delivery_annotations = delivery_annotations
        self.footer = footer

    @property
    def body(self) -> Any:
        """DATA: a generator of the data sections (bytes); SEQUENCE: a
        generator of the sections (lists); VALUE: the value."""
        if self._body_type == AmqpMessageBodyType.VALUE:
            return self._body
        return (section for section in self._body)

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return self._body_type

    def __str__(self) -> str:
        if self._body_type == AmqpMessageBodyType.DATA:
            return b"".join(self._body).decode(self._encoding, errors="replace")
        return str(self._body)

    def __repr__(self) -> str:
        return (f"AmqpAnnotatedMessage(body={str(self)[:40]!r}, body_type={self._body_type}, "
                f"properties={self.properties}, "
                f"application_properties={self.application_properties})")


__all__ = ["AmqpAnnotatedMessage", "AmqpMessageBodyType", "AmqpMessageHeader",
           "AmqpMessageProperties"]
