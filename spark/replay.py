"""Replay jobs (Spark batch): resubmit dead letters, re-publish a time range.

Spark does the reading: which messages are dead letters now, with which
reason and since when (the event stream, folded as the audit folds it), which
records fall in a time range (the raw log), and which copies the target
already holds (its log, by the ``replayed_from`` property every copy carries).
The driver then sends through the library's client, so the copies are
ordinary messages and dead letters leave their sub-queue by a real
settlement. Running a replay twice sends nothing more: what the target holds
is skipped.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterator

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from settlement import message_records
from settlement.client import ServiceBusClient
from settlement.dead_letters import REPLAYED_FROM, replay_dead_letters, replay_id
from settlement.message import ServiceBusReceivedMessage, copy_message
from spark.audit import fold_messages
from spark.records import read_entity_logs, read_events
from topics.connection import parse_connection_string
from topics.message_record import APPLICATION_PROPERTIES
from topics.times import as_utc, epoch_ms

Progress = Callable[[int], None]
_CHUNK = 500


def replayed_ids(spark: SparkSession, connection_string: str, target: str) -> frozenset[str]:
    """The ``replayed_from`` values of the copies ``target`` already holds."""
    logs = read_entity_logs(spark, parse_connection_string(connection_string), [target])
    props = F.expr(f"cast(filter(headers, h -> h.key = '{APPLICATION_PROPERTIES}')[0].value "
                   "as string)")
    found = (logs.select(F.get_json_object(props, f"$.{REPLAYED_FROM}").alias("id"))
             .where(F.col("id").isNotNull()).distinct().collect())
    return frozenset(row.id for row in found)


def dead_letters(spark: SparkSession, connection_string: str, entity: str, *,
                 reason: str | None = None, since: dt.datetime | None = None,
                 until: dt.datetime | None = None) -> DataFrame:
    """The messages of ``entity`` in its dead-letter sub-queue now, with the
    reason and time (``dead_lettered_at``) of their dead-lettering, filtered."""
    events = read_events(spark, parse_connection_string(connection_string), [entity])
    now_dead = fold_messages(events).where(F.col("state") == "dead_letter")
    lettered = (events.where(F.col("type") == "dead_lettered")
                .select("partition", F.explode("offsets").alias("offset"), "reason",
                        "event_time", "record_offset")
                .groupBy("partition", "offset")
                .agg(F.max_by(F.struct("reason", "event_time"),
                              F.struct("event_time", "record_offset")).alias("d"))
                .select("partition", "offset", F.col("d.reason").alias("reason"),
                        F.col("d.event_time").alias("dead_lettered_at")))
    chosen = now_dead.select("partition", "offset").join(lettered, ["partition", "offset"])
    if reason is not None:
        chosen = chosen.where(F.col("reason") == reason)
    return chosen.where(_between("dead_lettered_at", since, until))


def replay_dlq(spark: SparkSession, client: ServiceBusClient, connection_string: str,
               entity: str, *, reason: str | None = None, since: dt.datetime | None = None,
               until: dt.datetime | None = None, to: str | None = None,
               on_progress: Progress | None = None) -> int:
    """Resubmit the matching dead letters of ``entity`` (to ``to``, default
    itself); return how many left the dead-letter sub-queue."""
    chosen = {(int(r.partition), int(r.offset)) for r in dead_letters(
        spark, connection_string, entity, reason=reason, since=since, until=until).collect()}
    if not chosen:
        return 0
    already = replayed_ids(spark, connection_string, to or entity)
    return replay_dead_letters(client, entity, chosen, to=to, already_sent=already,
                               on_progress=on_progress)


def replay_range(spark: SparkSession, client: ServiceBusClient, connection_string: str,
                 entity: str, to: str, *, since: dt.datetime,
                 until: dt.datetime | None = None, on_progress: Progress | None = None) -> int:
    """Re-publish the messages ``entity``'s log received in ``[since, until)``
    to ``to``; return how many were sent (copies ``to`` holds are skipped)."""
    if to == entity:
        raise ValueError("replay range needs a different target entity: re-publishing a "
                         "range to its own log would replay the copies too")
    logs = read_entity_logs(spark, parse_connection_string(connection_string), [entity])
    selected = logs.where(_between("timestamp", since, until))
    already = replayed_ids(spark, connection_string, to)
    sent = 0
    with client.get_queue_sender(to) as sender:
        messages = _messages(selected.orderBy("partition", "offset"))
        while chunk := list(itertools.islice(messages, _CHUNK)):
            copies = [copy_message(m, {REPLAYED_FROM: replay_id(entity, m)}) for m in chunk
                      if replay_id(entity, m) not in already]
            if copies:
                sender.send_messages(copies)
                sent += len(copies)
                if on_progress is not None:
                    on_progress(len(copies))
    return sent


def _between(column: str, since: dt.datetime | None, until: dt.datetime | None) -> Column:
    """``since <= column < until`` at Kafka's resolution: whole milliseconds (a
    record stamped in the millisecond of ``since`` is in the range)."""
    condition = F.lit(True)
    if since is not None:
        condition &= F.col(column) >= F.lit(_to_ms(since))
    if until is not None:
        condition &= F.col(column) < F.lit(_to_ms(until))
    return condition


def _to_ms(moment: dt.datetime) -> dt.datetime:
    moment = as_utc(moment)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _messages(records: DataFrame) -> Iterator[ServiceBusReceivedMessage]:
    for row in records.toLocalIterator():
        headers = [(h.key, bytes(h.value) if h.value is not None else None)
                   for h in row.headers or []]
        yield message_records.decode(bytes(row.value) if row.value is not None else None,
                                     headers, epoch_ms(row.timestamp), row.partition, row.offset,
                                     lenient=True)
