"""Times as records carry them: epoch milliseconds, UTC."""

from __future__ import annotations

import datetime as dt
from typing import overload

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


def as_utc(value: dt.datetime) -> dt.datetime:
    """A naive datetime is taken as UTC, as the SDK does."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


def epoch_ms(value: dt.datetime) -> int:
    """Whole milliseconds since the epoch (exact: no float rounding), floored."""
    return (as_utc(value) - _EPOCH) // _MS


@overload
def utc_from_ms(ms: int) -> dt.datetime: ...
@overload
def utc_from_ms(ms: None) -> None: ...
@overload
def utc_from_ms(ms: int | None) -> dt.datetime | None: ...
def utc_from_ms(ms: int | None) -> dt.datetime | None:
    return None if ms is None else _EPOCH + ms * _MS
