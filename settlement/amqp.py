"""The AMQP names of ``azure.servicebus.amqp`` that apply here.

A message body is one DATA section of bytes (a Kafka record's value); the
SDK's SEQUENCE and VALUE bodies have no record to travel in.
"""

from __future__ import annotations

from enum import StrEnum

from azure.core import CaseInsensitiveEnumMeta


class AmqpMessageBodyType(StrEnum, metaclass=CaseInsensitiveEnumMeta):
    DATA = "data"
    SEQUENCE = "sequence"
    VALUE = "value"


__all__ = ["AmqpMessageBodyType"]
