"""Times as records carry them: epoch milliseconds, UTC."""

from __future__ import annotations

import datetime as dt


def as_utc(value: dt.datetime) -> dt.datetime:
    """A naive datetime is taken as UTC, as the SDK does."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


def epoch_ms(value: dt.datetime) -> int:
    return int(as_utc(value).timestamp() * 1000)


def utc_from_ms(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
