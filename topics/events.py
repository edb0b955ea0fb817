"""The engine's records on the events topic (``NS.__events``), the state
topic (``NS.__state``) and a paired client's status topic (``NS.__pairing``):
JSON objects, declared here field by field so that their writers and the
Spark jobs that read them (``spark.records``) agree.

* An event record says what one command did to one window: its ``type``
  (``locked``, ``dead_lettered``, ``scheduled``...), the offsets it
  concerns and the ``cmd`` that caused it (a command processed again after a
  crash publishes the same events again, under the same id), keyed
  ``ENTITY#PARTITION``. The offsets are listed in ``offsets``, or, for the
  ``filtered`` event, given as ``ranges`` (runs: see :mod:`topics.runs`).
* A state record is a window's summary (its counts, ``start``, ``next``,
  ``hw``, event totals), keyed ``ENTITY#PARTITION``, or, on session-enabled
  entities, a session's (``session``, ``active``, ``locked_until``,
  ``state_size``, ``gone``), keyed ``ENTITY#PARTITION#SESSION``; a session
  record with ``gone`` is followed by a tombstone. State records have no ``type``.

The fields listed are those readers rely on; records may carry more (a
window summary's ``totals`` and ``scanned``, for example).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topics import jsonbytes


class FieldType(enum.Enum):
    TEXT = "text"
    INT = "int"            # 32 bits: partitions
    LONG = "long"          # 64 bits: offsets, counts, epoch milliseconds
    LONGS = "longs"        # a list of 64-bit integers


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType


def _fields(type_: FieldType, *names: str) -> tuple[Field, ...]:
    return tuple(Field(name, type_) for name in names)


TEXT, INT, LONG, LONGS = FieldType.TEXT, FieldType.INT, FieldType.LONG, FieldType.LONGS

EVENT_FIELDS = (
    Field("type", TEXT), Field("entity", TEXT), Field("partition", INT),
    Field("offsets", LONGS), Field("count", LONG), Field("ts", LONG), Field("cmd", TEXT),
    # what some kinds add: a dead letter's reason and description, the
    # sub-queue, a forward target, a lock's end, and per offset the
    # deliveries and enqueued times of a delivery
    Field("reason", TEXT), Field("description", TEXT), Field("sub", TEXT),
    Field("first", LONG), Field("to", TEXT), Field("until", LONG),
    *_fields(LONGS, "held", "deliveries", "enqueued"),
    # offsets as runs, instead of ``offsets``: what a subscription's rules
    # left out (see ``topics.runs``)
    Field("ranges", LONGS))

#: a window's counts of messages by state, on its state record
GAUGES = ("active", "locked", "deferred", "scheduled", "dead_letter", "transfer_dead_letter")

STATE_FIELDS = (
    Field("entity", TEXT), Field("partition", INT),
    *_fields(LONG, "start", "next", "hw", "ts"),
    # a session's record: ``active`` is then its active messages
    Field("session", TEXT), *_fields(LONG, "locked_until", "state_size"),
    *_fields(LONG, *GAUGES))

#: a paired client's status record (see ``settlement.pairing.StatusTopic``)
PAIRING_FIELDS = (
    *_fields(TEXT, "primary", "entity", "kind", "client", "event", "mode"),
    *_fields(LONG, "failovers", "sent_to_backlog", "ts"))


def event_record(type_: str, entity: str, partition: int, offsets: list[int], count: int,
                 ts: int, command_id: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """An event record, its fields in the order the engine has always written them."""
    return {"type": type_, "entity": entity, "partition": partition, "offsets": offsets,
            "count": count, "ts": ts, "cmd": command_id, **extra}


#: event fields that hold one value per offset, in the order of ``offsets``
PER_OFFSET_FIELDS = ("held", "deliveries", "enqueued")
#: fields that two events may differ in and still be one record
_MERGED_FIELDS = frozenset({"offsets", "count", "ts", "cmd", *PER_OFFSET_FIELDS})


def merge_event(into: dict[str, Any], record: Mapping[str, Any]) -> bool:
    """Append ``record``'s offsets to ``into`` when they are the same event
    of the same window (type and every other detail equal), as one record;
    whether they were. The merged record keeps ``into``'s command id and
    time: readers drop repeats by command id, and a repeat is always the
    whole record again. ``into``'s lists are extended in place (a batch of
    n merges costs n, not n²): ``into`` must own them (see ``own_event``)."""
    if (into.keys() != record.keys() or into["count"] != len(into["offsets"])
            or record["count"] != len(record["offsets"]) or not record["offsets"]
            or any(into[k] != record[k] for k in into if k not in _MERGED_FIELDS)):
        return False
    for name in ("offsets", *PER_OFFSET_FIELDS):
        if name in into:
            into[name].extend(record[name])
    into["count"] = len(into["offsets"])
    return True


def own_event(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an event record whose lists ``merge_event`` may extend."""
    return {k: list(v) if isinstance(v, list) else v for k, v in record.items()}


def state_record(summary: Mapping[str, Any], ts: int) -> dict[str, Any]:
    """A window's or a session's summary, stamped."""
    return {**summary, "ts": ts}


def is_event(record: Mapping[str, Any]) -> bool:
    """An event record (for the events topic), not a state record."""
    return "type" in record


def record_key(record: Mapping[str, Any]) -> bytes:
    key = f"{record['entity']}#{record['partition']}"
    if "session" in record:  # a session's summary, keyed by its session
        key += f"#{record['session']}"
    return key.encode()


def encode_record(record: Mapping[str, Any]) -> bytes:
    return jsonbytes.dumps(record)
