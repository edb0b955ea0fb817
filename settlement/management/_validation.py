"""Arguments of the administration client, checked against Service Bus's limits."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from settlement._keywords import refuse
from topics import names
from topics.entities.queue import DEFAULT_TTL, MAX_LOCK, MIN_AUTO_DELETE_ON_IDLE, PARTITIONED_COUNT

_DUPLICATE_WINDOW = (dt.timedelta(seconds=20), dt.timedelta(days=7))
#: the SDK's duration arguments, which also take seconds here
DURATIONS = ("lock_duration", "default_message_time_to_live",
             "duplicate_detection_history_time_window", "auto_delete_on_idle")
_ISO_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d*)?)S)?)?")
#: fields of the properties that a create or update call does not set
_NOT_SETTABLE = frozenset({"name", "topic_name", "begin_offsets", "created_at_utc",
                           "updated_at_utc"})
#: SDK options for what is always so here -> (the values that say so, why others are refused)
_ALWAYS = {
    "enable_batched_operations": ((True,), "the engine always groups the writes of a "
                                           "command; it cannot be turned off"),
    "enable_express": ((False,), "every message is in the Kafka log before its send "
                                 "returns; there are no express entities"),
    "filtering_messages_before_publishing": ((False,), "subscriptions' rules are evaluated "
                                                       "by the engine as it reads the topic"),
    "status": (("Active",), "entities are always active here: delete one to stop it"),
}
#: SDK options that have no meaning here -> why
_REFUSED = {
    "authorization_rules": "rights are Kafka ACLs of principals: grant them with "
                           "'settlement acl PRINCIPAL --right RIGHT --entity NAME --apply'",
    "size_in_bytes": "an entity's size is measured (get_*_runtime_properties), not set",
}


#: what the SDK's administration client passes to its HTTP pipeline -> why it
#: does not apply here (every call is Kafka requests and engine commands)
_HTTP_OPTIONS = {
    "api_version": "there is no Service Bus REST API here: the client speaks Kafka's "
                   "protocol and the engine's commands",
    "headers": "there are no HTTP requests to add headers to",
    "transport": "there is no HTTP transport to replace",
    "policies": "there is no HTTP pipeline to add policies to",
    "logging_enable": "there is no HTTP traffic to log; set the level of the "
                      "'settlement' loggers instead",
    "retry_total": "calls to the engine retry twice on their own (5 s per attempt)",
    "timeout": "calls to the engine retry twice on their own (5 s per attempt)",
}


def refuse_admin(where: str, kwargs: dict[str, Any]) -> None:
    """:func:`settlement._keywords.refuse`, saying also why the SDK's HTTP
    options do not apply to the administration client."""
    for name in kwargs:
        if name in _HTTP_OPTIONS:
            raise TypeError(f"{where}() keyword {name!r} is not supported here: "
                            f"{_HTTP_OPTIONS[name]}")
    refuse(where, kwargs)


def sdk_options(where: str, cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a ``create_*`` or ``update_*`` call (or the entries of
    the dict the SDK's ``update_*`` also take) that set a field of ``cls``,
    durations as timedeltas; a None is the SDK's "not given". An SDK option
    for what is always so here passes only with that value; any other
    keyword is refused with a ``TypeError`` that says why."""
    fields = {f.name for f in dataclasses.fields(cls)} - _NOT_SETTABLE
    honoured: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in fields or name in _ALWAYS or name in _REFUSED:
            if value is None:
                continue
            if name in fields:
                honoured[name] = value
                continue
            allowed, why = _ALWAYS.get(name, ((), _REFUSED.get(name, "")))
            if value not in allowed:
                raise TypeError(f"{where}() keyword {name}={value!r} is not supported "
                                f"here: {why}")
        else:
            rest[name] = value
    refuse_admin(where, rest)
    return as_timedeltas(honoured)


def overridden(where: str, current: Any, wanted: Any, kwargs: dict[str, Any]) -> Any:
    """What an ``update_*(entity, **kwargs)`` asks for: ``wanted`` (the
    properties, or a dict of those to change) with ``kwargs`` over it, as the
    SDK's update calls take them."""
    if isinstance(wanted, Mapping):
        changes = {k: v for k, v in wanted.items() if k != "name"}
        wanted = dataclasses.replace(current, **sdk_options(where, type(current), changes))
    return dataclasses.replace(wanted, **sdk_options(where, type(current), kwargs))


def as_timedeltas(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Accept seconds or ISO 8601 durations ("PT5M", as the SDK does) where
    the SDK accepts timedeltas."""
    out = dict(kwargs)
    for key in DURATIONS:
        if isinstance(out.get(key), int | float):
            out[key] = dt.timedelta(seconds=out[key])
        elif isinstance(out.get(key), str):
            out[key] = _iso_duration(key, out[key])
        if isinstance(out.get(key), dt.timedelta):  # Service Bus's "never" at most
            out[key] = min(out[key], DEFAULT_TTL)
    if out.get("enable_partitioning") and "partition_count" not in out:
        out["partition_count"] = PARTITIONED_COUNT
    return out


def _iso_duration(option: str, text: str) -> dt.timedelta:
    found = _ISO_DURATION.fullmatch(text.strip().upper())
    if found is None or text.strip().upper() in ("P", "PT"):
        raise ValueError(f"{option} must be a timedelta, seconds or an ISO 8601 duration "
                         f"such as 'PT5M' or 'P1DT2H', got {text!r}")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in found.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def validated_idle(props: Any) -> Any:
    """An entity whose ``auto_delete_on_idle`` Service Bus accepts: at least
    5 minutes (the default, "never", is the largest timedelta it has)."""
    if not MIN_AUTO_DELETE_ON_IDLE <= props.auto_delete_on_idle <= DEFAULT_TTL:
        raise ValueError(f"auto_delete_on_idle must be at least 5 minutes (Service Bus's "
                         f"minimum), got {props.auto_delete_on_idle}")
    return props


def validated(props: Any) -> Any:
    """Queue or subscription properties, checked against Service Bus's limits."""
    if not dt.timedelta(seconds=1) <= props.lock_duration <= MAX_LOCK:
        raise ValueError(f"lock_duration must be between 1 second and 5 minutes, "
                         f"got {props.lock_duration}")
    if props.max_delivery_count < 1:
        raise ValueError(f"max_delivery_count must be at least 1, got {props.max_delivery_count}")
    validated_idle(props)
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
    validated_idle(props)
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
