"""JSON as the processes write and read their records, through orjson.

Commit records, answers, events and entries are JSON on the engine's and
the client's hot paths; the standard library's ``json`` took 12-16 % of
the engine's time (py-spy, receive 1,000 + complete_messages), orjson a
fraction of that. Both write the same JSON for what these records hold
(compact, text as UTF-8 rather than ``\\u`` escapes: the same values read
back).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON bytes."""
    try:
        return orjson.dumps(value)
    except TypeError:
        # What orjson refuses and json writes: text with a lone surrogate
        # (a reason decoded from a "\ud800" escape), integers past 64 bits,
        # keys that are not text.
        return json.dumps(value, separators=(",", ":")).encode()


def loads(raw: bytes | bytearray | str) -> Any:
    """The value of JSON ``raw``; what ``json.loads`` raises if it is not
    JSON (a ``ValueError``, or ``UnicodeDecodeError`` for bytes that are
    not UTF-8)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # json reads what orjson refuses (a lone surrogate's escape, NaN):
        # what was accepted stays accepted, and what was not raises as before.
        return json.loads(raw)


#: 19 digits in a row: perhaps an integer past 64 bits, which orjson reads
#: as a float (every integer of 18 digits or fewer fits in 64 bits)
_LONG_DIGITS = re.compile(r"\d{19}")
_LONG_DIGITS_BYTES = re.compile(rb"\d{19}")


def loads_exact(raw: bytes | bytearray | str) -> Any:
    """As :func:`loads`, but integers of any size are read exactly, as
    ``json.loads`` reads them: for values applications gave (application
    properties, VALUE bodies), which ``json`` wrote. Text with a long run
    of digits goes to ``json`` (it may be in a string: read the slower way,
    the same values)."""
    long = (_LONG_DIGITS.search(raw) if isinstance(raw, str)
            else _LONG_DIGITS_BYTES.search(raw))
    return json.loads(raw) if long else loads(raw)
