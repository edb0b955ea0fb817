"""The JSON form every definition takes on the entities topic: durations in
seconds, times in ISO 8601, and a ``kind`` (queue, topic, subscription, rule
or namespace)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Collection
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # typeshed's name for "any dataclass"; it exists for the checker only
    from _typeshed import DataclassInstance

    D = TypeVar("D", bound=DataclassInstance)
else:
    D = TypeVar("D")


def definition_json(kind: str, definition: DataclassInstance,
                    leave_out: Collection[str] = ()) -> bytes:
    """A definition dataclass as stored: durations in seconds, times in ISO
    8601, and its ``kind``; without the fields ``leave_out`` (kept elsewhere)."""
    body: dict[str, Any] = {"kind": kind}
    for key, value in asdict(definition).items():
        if key in leave_out:
            continue
        if isinstance(value, dt.timedelta):
            value = value.total_seconds()
        elif isinstance(value, dt.datetime):
            value = value.isoformat()
        body[key] = value
    return json.dumps(body).encode()


def from_definition(cls: type[D], body: object) -> D:
    """The dataclass ``cls`` from its stored form; fields it does not know
    (written by a newer version) are left out. Anything malformed (not an
    object, a missing name, a field of the wrong type) raises ValueError:
    readers of the entities topic skip such a record and go on."""
    if not isinstance(body, dict):
        raise ValueError("a definition must be a JSON object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in body.items():
        if key not in fields:
            continue
        kind = str(fields[key].type)
        if "timedelta" in kind and isinstance(value, int | float):
            value = dt.timedelta(seconds=value)
        elif "datetime" in kind and isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        values[key] = value
    try:
        made = cls(**values)
    except TypeError as exc:
        raise ValueError(f"not a {cls.__name__}: {exc}") from None
    for field_ in dataclasses.fields(cls):
        value = getattr(made, field_.name)
        if not _of_type(value, str(field_.type)):
            raise ValueError(f"{cls.__name__}.{field_.name} is {value!r}, not {field_.type}")
    return made


def _of_type(value: Any, annotation: str) -> bool:
    """Whether a stored value fits a field's annotation (the few kinds
    definitions use)."""
    if value is None:
        return "None" in annotation
    base = annotation.split("|")[0].strip()
    expected: dict[str, type | tuple[type, ...]] = {
        "dt.timedelta": dt.timedelta, "dt.datetime": dt.datetime, "bool": bool, "str": str,
        "int": int, "list[int]": list}
    if base not in expected or not isinstance(value, expected[base]):
        return False
    if base == "int":
        return not isinstance(value, bool)
    if base == "list[int]":
        return isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
    return True
