"""AMQP values as JSON: how a record carries application property values and
VALUE or SEQUENCE bodies (``docs/wire-format.md``).

JSON has strings, numbers, booleans, null, arrays and objects; the AMQP
types the SDK sends besides those travel as an object with one tagged key,
which any JSON library reads and writes:

* ``bytes`` (AMQP binary): ``{"$binary": "<base64>"}``
* ``uuid.UUID``: ``{"$uuid": "<8-4-4-4-12 hex>"}``
* ``datetime.datetime`` (AMQP timestamp): ``{"$timestamp": <epoch milliseconds>}``;
  a naive datetime is taken as UTC, and one read back is aware, in UTC, to
  the millisecond (AMQP's precision);
* a map (in a VALUE or SEQUENCE body) with a key that is not a string, or
  whose one key is a tag: ``{"$map": [[key, value], ...]}``.

Plain JSON stays what it says, so records written before these tags, or by
a Kafka client that writes plain JSON, read as they always did.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Any

from topics import jsonbytes
from topics.times import epoch_ms, utc_from_ms

BINARY, UUID, TIMESTAMP, MAP = "$binary", "$uuid", "$timestamp", "$map"

#: the types of an application property value, as the SDK takes them
PROPERTY_TYPES = (str, bytes, int, float, bool, uuid.UUID, dt.datetime, type(None))
PROPERTY_TYPE_NAMES = "str, bytes, int, float, bool, uuid.UUID, datetime.datetime or None"


def _tagged(value: Any) -> Any:
    """The JSON form of one value that JSON has no type for, else ``value``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {BINARY: base64.b64encode(value).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {UUID: str(value)}
    if isinstance(value, dt.datetime):
        return {TIMESTAMP: epoch_ms(value)}
    return value


def to_json(value: Any, where: str) -> Any:
    """``value`` (scalars of :data:`PROPERTY_TYPES`, lists, tuples and maps
    of them, nested) as JSON-encodable data with tagged values. Raise
    TypeError naming ``where`` for anything else."""
    if isinstance(value, list | tuple):
        return [to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and not (
                len(value) == 1 and next(iter(value)) in _DECODERS):
            return {key: to_json(item, f"{where}[{key!r}]") for key, item in value.items()}
        return {MAP: [[to_json(key, f"{where} key {key!r}"), to_json(item, f"{where}[{key!r}]")]
                      for key, item in value.items()]}
    if not isinstance(value, PROPERTY_TYPES + (bytearray, memoryview)):
        raise TypeError(f"{where} is a {type(value).__name__}; the values a record carries "
                        f"are {PROPERTY_TYPE_NAMES}, and lists and maps of them")
    return _tagged(value)


def _binary(text: Any) -> bytes:
    return base64.b64decode(text, validate=True)


def _timestamp(ms: Any) -> dt.datetime:
    if not isinstance(ms, int) or isinstance(ms, bool):
        raise ValueError(f"{TIMESTAMP} must be an integer of epoch milliseconds, not {ms!r}")
    return utc_from_ms(ms)


def _map(pairs: Any) -> dict[Any, Any]:
    if not isinstance(pairs, list) or not all(
            isinstance(pair, list) and len(pair) == 2 for pair in pairs):
        raise ValueError(f"{MAP} must be an array of [key, value] arrays")
    return {from_json(key): from_json(item) for key, item in pairs}


_DECODERS: dict[str, Callable[[Any], Any]] = {
    BINARY: _binary, UUID: lambda text: uuid.UUID(text), TIMESTAMP: _timestamp, MAP: _map}


def from_json(data: Any) -> Any:
    """The value :func:`to_json` made ``data`` from: tagged objects become
    bytes, UUID and datetime again. Raise ValueError for a tag whose value
    cannot be read."""
    if isinstance(data, list):
        return [from_json(item) for item in data]
    if isinstance(data, dict):
        if len(data) == 1:
            ((tag, text),) = data.items()
            decoder = _DECODERS.get(tag)
            if decoder is not None:
                try:
                    return decoder(text)
                except (TypeError, ValueError, binascii.Error, OverflowError) as exc:
                    raise ValueError(f"cannot read {{{tag!r}: {text!r}}}: {exc}") from None
        # a scalar (most property values) is itself: a map of scalars (most
        # application properties) is returned as it is
        for item in data.values():
            if isinstance(item, (list, dict)):
                return {key: from_json(item) if isinstance(item, (list, dict)) else item
                        for key, item in data.items()}
        return data
    return data


def dumps(value: Any, where: str) -> bytes:
    """``value`` as compact UTF-8 JSON with tagged values."""
    return json.dumps(to_json(value, where), separators=(",", ":")).encode()


def loads(raw: bytes | str) -> Any:
    """What :func:`dumps` wrote; ValueError for text that is not such JSON.
    Through orjson where it reads the same values (a received message's
    application properties: 2.7 -> 1.0 us)."""
    return from_json(jsonbytes.loads_exact(raw))
