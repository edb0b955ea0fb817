"""The audit: every message's final state, rebuilt from the raw log and the
event stream, checked against the engine's compacted state topic.

Spark batch job. For each entity partition it

1. lists the messages of the raw log (``NS.queue.ENTITY``; a subscription's
   is its topic's log from where the subscription began): every offset is a
   message, ``active`` until an event says otherwise (a subscription's
   ``filtered`` event settles what its rules did not select);
2. folds the settlement events of each offset in the order the engine
   published them (one events partition per window, so record order is
   command order), dropping repeats of a command re-processed after a crash;
3. compares the result with the newest ``NS.__state`` record of the window.

Findings, each a reason for a non-zero exit status:

``lost``           below the window's ``start`` (the engine considers it
                   settled or parked) but no event settled or parked it;
``stuck``          locked, and the lock ended ``grace`` ago with no lapse;
``double``         settled for good by two different commands;
``phantom``        events name an offset the raw log does not have (and never had:
                   offsets below the log start were deleted by the engine's log
                   trimmer, which is right only if they were settled: a deleted
                   offset that was not is ``lost``);
``inconsistent``   a count of the state record (active, locked, deferred,
                   scheduled, dead_letter, transfer_dead_letter) differs from
                   the count the events give.

A window whose newest event is newer than its newest state record is still
being written and is reported as ``pending``, not as inconsistent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.records import parse_states, read_entity_logs, read_events, subscription_begins
from spark.source import read_kafka
from topics import names
from topics.connection import ConnectionSettings, parse_connection_string
from topics.events import GAUGES

#: events that settle a message for good
TERMINAL = frozenset({"completed", "received_and_deleted", "expired", "cancelled",
                      "duplicate", "forwarded", "filtered"})
#: events that move a message into a parked state
PARKING = {"dead_lettered": "dead_letter", "transfer_dead_lettered": "transfer_dead_letter",
           "deferred": "deferred", "scheduled": "scheduled"}
FOLDED = ("entity string, partition int, offset long, state string, locked boolean, "
          "settled_by int, lock_ends long, activated boolean")
FINDINGS = ("lost", "stuck", "double", "phantom", "inconsistent")


@dataclass
class AuditReport:
    """What the audit found; ``ok`` when nothing but pending windows.
    ``messages`` counts those in the log and those trimmed from it."""

    messages: int = 0
    windows: int = 0
    findings: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {kind: [] for kind in FINDINGS})
    pending: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.findings.values())

    def summary(self) -> str:
        counts = ", ".join(f"{kind} {len(found)}" for kind, found in self.findings.items())
        verdict = "OK" if self.ok else "PROBLEMS FOUND"
        text = (f"audit: {self.messages} messages in {self.windows} entity partitions: "
                f"{counts}; pending {len(self.pending)} -> {verdict}")
        for kind, found in self.findings.items():
            for item in found[:10]:
                text += f"\n  {kind}: {json.dumps(item, default=str)}"
            if len(found) > 10:
                text += f"\n  {kind}: ... and {len(found) - 10} more"
        return text


@dataclass
class _Message:
    """One offset as its events leave it."""

    state: str = "active"   # active, settled or a parked state (dead_letter, deferred, ...)
    locked: bool = False
    settlers: set[str] = field(default_factory=set)  # commands that settled it for good
    lock_ends: int = 0
    lock_ms: int = 0
    activated: bool = False  # a scheduled message that came due: may sit below ``start``


def fold_messages(events: DataFrame) -> DataFrame:
    """Per offset named by ``events`` (see :func:`spark.records.read_events`):
    its final ``state``, ``locked``, ``settled_by`` (commands that settled
    it for good), ``lock_ends`` and ``activated``."""
    return events.groupBy("entity", "partition").applyInPandas(fold_window, FOLDED)


def fold_window(events: pd.DataFrame) -> pd.DataFrame:
    """Final state of every offset one window's events name (``applyInPandas``)."""
    messages: dict[int, _Message] = {}
    # One window's events share one events partition: record order is command
    # order. The time comes first only for records that arrived elsewhere.
    for row in events.sort_values(["ts", "record_offset"]).itertuples(index=False):
        for offset in row.offsets:
            _apply(messages.setdefault(int(offset), _Message()), row)
    first = events.iloc[0]
    return pd.DataFrame(
        [(first.entity, int(first.partition), offset, m.state, m.locked, len(m.settlers),
          m.lock_ends, m.activated) for offset, m in messages.items()],
        columns=["entity", "partition", "offset", "state", "locked", "settled_by",
                 "lock_ends", "activated"])


def _apply(message: _Message, row: Any) -> None:
    kind = row.type
    if kind in TERMINAL:
        message.state, message.locked = "settled", False
        message.settlers.add(row.cmd)
    elif kind in PARKING:
        message.state, message.locked = PARKING[kind], False
    elif kind == "locked":
        message.locked = True
        message.lock_ends = int(row.until) if pd.notna(row.until) else 0
        message.lock_ms = max(0, message.lock_ends - int(row.ts))
    elif kind == "renewed" and message.locked:
        message.lock_ends = int(row.ts) + message.lock_ms
    elif kind in ("abandoned", "lock_expired"):
        message.locked = False
    elif kind == "activated":
        message.state, message.activated = "active", True


def _states(spark: SparkSession, settings: ConnectionSettings,
            entities: list[str]) -> pd.DataFrame:
    """The newest state record of each window of ``entities``."""
    raw = read_kafka(spark, settings.bootstrap_servers, [names.state(settings.namespace)],
                     security=settings.security)
    states = parse_states(raw)
    latest = (states.where(F.col("entity").isin(entities))
              .groupBy("entity", "partition")
              .agg(F.max_by(F.struct(*GAUGES, "start", "hw", "ts"),
                            F.struct("ts", "record_offset")).alias("s"))
              .select("entity", "partition", "s.*"))
    return latest.toPandas()


def run_audit(spark: SparkSession, connection_string: str, entities: list[str], *,
              grace_ms: int = 30_000) -> AuditReport:
    """Audit ``entities``; see the module docstring for what is checked."""
    settings = parse_connection_string(connection_string)
    events = read_events(spark, settings, entities)
    last_event = events.groupBy("entity", "partition").agg(F.max("ts").alias("last_ts"))
    folded = fold_messages(events)
    log_rows = read_entity_logs(spark, settings, entities).select(
        "entity", "partition", "offset").withColumn("in_log", F.lit(True))
    messages = (log_rows.join(folded, ["entity", "partition", "offset"], "full_outer")
                .fillna({"state": "active", "locked": False, "settled_by": 0, "lock_ends": 0,
                         "activated": False, "in_log": False})
                .toPandas())
    states = _states(spark, settings, entities)
    freshness = last_event.toPandas()
    starts = _log_starts(settings, [(s.entity, int(s.partition))
                                    for s in states.itertuples(index=False)])
    begins = {(entity, partition): offset
              for entity, partition, offset in subscription_begins(spark, settings, entities)}
    return _judge(messages, states, freshness, starts, int(time.time() * 1000), grace_ms,
                  begins=begins)


def _log_starts(settings: ConnectionSettings,
                windows: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Where each window's log starts now: above 0 where the engine trimmed it."""
    consumer = Consumer(settings.consumer_config("audit-log-starts"))
    try:
        return {(entity, partition): consumer.get_watermark_offsets(TopicPartition(
                    names.entity_log(settings.namespace, entity), partition), timeout=10)[0]
                for entity, partition in windows}
    finally:
        consumer.close()


def _judge(messages: pd.DataFrame, states: pd.DataFrame, freshness: pd.DataFrame,
           log_starts: dict[tuple[str, int], int], now: int, grace_ms: int, *,
           begins: dict[tuple[str, int], int] | None = None) -> AuditReport:
    """``begins``: where each subscription's window began in its topic's log
    (a queue's begins at 0): what was trimmed below that was never its."""
    begins = begins or {}
    report = AuditReport(windows=len(states))
    found = report.findings
    trimmed_seen: dict[tuple[str, int], int] = {}  # offsets below the log start events name
    for row in messages.itertuples(index=False):
        where = {"entity": row.entity, "partition": int(row.partition), "offset": int(row.offset)}
        window = (row.entity, int(row.partition))
        trimmed = int(row.offset) < log_starts.get(window, 0)
        trimmed_seen[window] = trimmed_seen.get(window, 0) + trimmed
        report.messages += bool(row.in_log or trimmed)
        if trimmed and row.state != "settled":
            found["lost"].append({**where, "state": row.state, "trimmed": True})
        elif not row.in_log and not trimmed:
            found["phantom"].append({**where, "state": row.state})
        if row.settled_by > 1:
            found["double"].append({**where, "settled_by_commands": int(row.settled_by)})
        if row.locked and row.lock_ends and row.lock_ends + grace_ms < now:
            found["stuck"].append({**where, "lock_ended_ms_ago": int(now - row.lock_ends)})
    for window, start in log_starts.items():  # trimmed, yet no event named it
        entity, partition = window
        unnamed = max(0, start - begins.get(window, 0)) - trimmed_seen.get(window, 0)
        if unnamed > 0:
            found["lost"].append({"entity": entity, "partition": partition,
                                  "trimmed_without_events": unnamed})
    last_ts = {(r.entity, int(r.partition)): int(r.last_ts)
               for r in freshness.itertuples(index=False)}
    for state in states.itertuples(index=False):
        window = (state.entity, int(state.partition))
        if last_ts.get(window, 0) > state.ts:
            report.pending.append(f"{state.entity}#{state.partition}")
            continue
        mine = messages[(messages["entity"] == state.entity)
                        & (messages["partition"] == state.partition) & messages["in_log"]]
        below = mine[(mine["offset"] < state.start) & (mine["state"] == "active")
                     & ~mine["activated"]]
        for row in below.itertuples(index=False):
            found["lost"].append({"entity": row.entity, "partition": int(row.partition),
                                  "offset": int(row.offset), "state": row.state})
        derived = _counts(mine, int(state.hw))
        differs = {g: {"state_topic": int(getattr(state, g)), "events": derived[g]}
                   for g in GAUGES if int(getattr(state, g)) != derived[g]}
        if differs:
            found["inconsistent"].append({"entity": state.entity,
                                          "partition": int(state.partition), **differs})
    return report


def _counts(messages: pd.DataFrame, hw: int) -> dict[str, int]:
    """The state record's counts as the events give them, over the offsets
    below the log end the engine knows: a locked dead letter or deferred
    message counts in its sub-queue, ``locked`` only active ones."""
    seen = messages[messages["offset"] < hw]
    counts = {g: int((seen["state"] == g).sum()) for g in GAUGES}
    counts["locked"] = int(((seen["state"] == "active") & seen["locked"]).sum())
    return counts
