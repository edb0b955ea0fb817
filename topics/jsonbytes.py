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
