"""Arguments of the administration client, checked against Service Bus's limits."""

from __future__ import annotations

import datetime as dt
from typing import Any

from settlement._properties import MAX_LOCK, PARTITIONED_COUNT
from topics import names

_DUPLICATE_WINDOW = (dt.timedelta(seconds=20), dt.timedelta(days=7))
#: the SDK's duration arguments, which also take seconds here
DURATIONS = ("lock_duration", "default_message_time_to_live",
             "duplicate_detection_history_time_window")


def as_timedeltas(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Accept seconds or ISO-ish timedeltas where the SDK accepts timedeltas."""
    out = dict(kwargs)
    for key in DURATIONS:
        if isinstance(out.get(key), int | float):
            out[key] = dt.timedelta(seconds=out[key])
    if out.get("enable_partitioning") and "partition_count" not in out:
        out["partition_count"] = PARTITIONED_COUNT
    return out


def validated(props: Any) -> Any:
    """Queue or subscription properties, checked against Service Bus's limits."""
    if not dt.timedelta(seconds=1) <= props.lock_duration <= MAX_LOCK:
        raise ValueError(f"lock_duration must be between 1 second and 5 minutes, "
                         f"got {props.lock_duration}")
    if props.max_delivery_count < 1:
        raise ValueError(f"max_delivery_count must be at least 1, got {props.max_delivery_count}")
    for target in (props.forward_to, props.forward_dead_lettered_messages_to):
        if target is not None:
            names.validate_entity(target)
    return props


def validated_log(props: Any) -> Any:
    """The settings of a queue's or a topic's log: duplicate window,
    partitions, size quota."""
    low, high = _DUPLICATE_WINDOW
    if not low <= props.duplicate_detection_history_time_window <= high:
        raise ValueError("duplicate_detection_history_time_window must be between 20 seconds "
                         "and 7 days")
    if not 1 <= props.partition_count <= 64:
        raise ValueError(f"partition_count must be 1..64, got {props.partition_count}")
    positive_or_none(props.max_size_in_megabytes, "max_size_in_megabytes", optional=False)
    return props


def positive_or_none(value: Any, option: str, *, optional: bool = True) -> int | None:
    """``value`` if it is a whole number of at least 1 (or None where
    ``optional``); otherwise a ValueError naming ``option``."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{option} must be a whole number of at least 1"
                         + (" or None (no limit)" if optional else "") + f", got {value!r}")
    return value
