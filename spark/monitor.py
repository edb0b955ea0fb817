"""The monitoring job: settlement events and window states -> windowed metrics.

Reads ``NS.__events``, the compacted ``NS.__state`` and ``NS.__pairing`` as
one stream, turns every record into *facts* ``(metric, label, value)`` and
aggregates them per entity in event-time windows with a watermark:

=====================  ===================  ======================================
metric                 label                value
=====================  ===================  ======================================
``count``              event type           messages (``enqueued`` = sends,
                                            ``completed``, ``abandoned``,
                                            ``lock_expired``, ``dead_lettered``,
                                            ``deferred``, ``expired``, ``duplicate``..)
``dead_letter_reason`` reason               dead-lettered messages
``lock_held_ms``       settlement type      lock to settlement, per message
``end_to_end_ms``      ``completed``        enqueue (log timestamp) to completion
``delivery_count``     the count            1 per message completed or dead-lettered
``gauge_<name>``       partition            active, locked, deferred, scheduled,
                                            dead_letter, transfer_dead_letter
``session_<name>``     session id           active (messages), locked_until (ms,
                                            0: free), state_size (bytes)
``pairing_event``      ``failover``, ...    1 per status record of a paired client
``pairing_<name>``     client id            mode (1: sending to the backlog),
                                            failovers, sent (to the backlog, so far)
=====================  ===================  ======================================

The last two come from ``NS.__pairing``, where clients of *other*
namespaces paired with this one report (this namespace is their
secondary); their entity is ``PRIMARY/ENTITY``. The backlog queues
themselves are entities of this namespace, with gauges like any queue.

Each window row has ``n`` (facts), ``total`` (sum), ``p50``/``p95``/``p99``
and ``last`` (the latest value: gauges). Event repeats from a command the
engine processed twice after a crash are dropped within the watermark by
(command id, type, entity, partition). Results go to Parquet through
:mod:`spark.metrics_store`, with the query's checkpoint next to them.

Run it as ``settlement monitor`` or ``spark-submit spark/monitor.py`` (on a
cluster: ``--master spark://HOST:7077``, see :mod:`spark.session`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark.metrics_store import write_batch
from spark.monitor_options import add_monitor_arguments
from spark.records import EVENT_SCHEMA, PAIRING_SCHEMA, STATE_SCHEMA
from spark.session import spark_session
from spark.source import read_kafka_stream
from topics import names
from topics.connection import ConnectionSettings, parse_connection_string
from topics.events import GAUGES

log = logging.getLogger(__name__)

FACT = "struct<metric:string,label:string,value:double>"
_NONE = f"cast(array() as array<{FACT}>)"


def _fact(metric: str, label: str, value: str) -> str:
    return f"named_struct('metric', '{metric}', 'label', {label}, 'value', cast({value} as double))"


def _per_message(array: str, metric: str, label: str, value: str, when: str = "true") -> str:
    """One fact per element ``x`` of an event's per-message array."""
    return (f"case when {when} and {array} is not null then transform(filter({array}, x -> x "
            f"is not null), x -> {_fact(metric, label, value)}) else {_NONE} end")


_EVENT_FACTS = "concat(" + ", ".join([
    f"array({_fact('count', 'e.type', 'e.count')})",
    "case when e.type in ('dead_lettered', 'transfer_dead_lettered') then array("
    + _fact("dead_letter_reason", "coalesce(e.reason, '(none)')", "e.count")
    + f") else {_NONE} end",
    _per_message("e.held", "lock_held_ms", "e.type", "x"),
    _per_message("e.enqueued", "end_to_end_ms", "'completed'", "e.ts - x",
                 "e.type = 'completed'"),
    _per_message("e.deliveries", "delivery_count", "cast(x as string)", "1",
                 "e.type in ('completed', 'dead_lettered')"),
]) + ")"
_STATE_FACTS = "array(" + ", ".join(
    _fact(f"gauge_{g}", "cast(s.partition as string)", f"s.{g}") for g in GAUGES) + ")"
_SESSION_FACTS = "array(" + ", ".join(
    _fact(f"session_{g}", "s.session", f"s.{g}")
    for g in ("active", "locked_until", "state_size")) + ")"
_PAIRING_FACTS = "array(" + ", ".join([
    _fact("pairing_event", "p.event", "1"),
    _fact("pairing_mode", "p.client", "case when p.mode = 'backlog' then 1 else 0 end"),
    _fact("pairing_failovers", "p.client", "p.failovers"),
    _fact("pairing_sent", "p.client", "p.sent_to_backlog")]) + ")"


def metric_facts(records: DataFrame, settings: ConnectionSettings,
                 watermark: str = "1 minute") -> DataFrame:
    """``entity, event_time, fact`` rows from the raw records of the three topics."""
    topic = F.col("topic")
    value = F.col("value").cast("string")
    parsed = records.select(
        "topic", "partition", "offset",
        F.when(topic == names.events(settings.namespace),
               F.from_json(value, EVENT_SCHEMA)).alias("e"),
        F.when(topic == names.state(settings.namespace),
               F.from_json(value, STATE_SCHEMA)).alias("s"),
        F.when(topic == names.pairing(settings.namespace),
               F.from_json(value, PAIRING_SCHEMA)).alias("p"))
    paired_entity = F.concat_ws("/", "p.primary", "p.entity")
    rows = (parsed
            .select("*",
                    F.coalesce("e.entity", "s.entity", paired_entity).alias("entity"),
                    F.timestamp_millis(F.coalesce("e.ts", "s.ts", "p.ts")).alias("event_time"),
                    # an event repeated by a re-processed command has the same id
                    F.when(F.col("e.cmd").isNotNull(),
                           F.concat_ws("|", "e.cmd", "e.type", "e.entity", "e.partition"))
                    .otherwise(F.concat_ws("|", "topic", "partition", "offset")).alias("uid"))
            .where(F.col("entity").isNotNull() & F.col("event_time").isNotNull()
                   & (F.col("e.type").isNotNull() | F.col("s.partition").isNotNull()
                      | (F.col("p.event").isNotNull() & F.col("p.client").isNotNull())))
            .withWatermark("event_time", watermark)
            .dropDuplicatesWithinWatermark(["uid"]))
    facts = F.expr(f"case when e is not null then {_EVENT_FACTS} "
                   f"when p is not null then {_PAIRING_FACTS} "
                   f"when s.session is not null then {_SESSION_FACTS} else {_STATE_FACTS} end")
    return rows.select("entity", "event_time", F.explode(facts).alias("fact"))


def aggregate(facts: DataFrame, window: str = "10 seconds") -> DataFrame:
    """Per entity, event-time window, metric and label: counts, sums, percentiles."""
    grouped = facts.groupBy(F.window("event_time", window).alias("w"), "entity",
                            F.col("fact.metric").alias("metric"),
                            F.col("fact.label").alias("label"))
    pct = F.percentile_approx("fact.value", F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99)), 1000)
    return (grouped.agg(F.count(F.lit(1)).alias("n"), F.sum("fact.value").alias("total"),
                        pct.alias("pct"), F.max_by("fact.value", "event_time").alias("last"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "entity", "metric", "label", "n", "total",
                    F.col("pct")[0].alias("p50"), F.col("pct")[1].alias("p95"),
                    F.col("pct")[2].alias("p99"), "last"))


def start_monitor(spark: SparkSession, connection_string: str, sink: str | Path, *,
                  checkpoint: str | Path | None = None, trigger_seconds: float = 2.0,
                  window: str = "10 seconds", watermark: str = "1 minute",
                  available_now: bool = False, max_records_per_trigger: int | None = None,
                  compact_every: int = 100) -> StreamingQuery:
    """Start the monitoring query; ``available_now`` reads what is there and stops."""
    settings = parse_connection_string(connection_string)
    topics = [names.events(settings.namespace), names.state(settings.namespace),
              names.pairing(settings.namespace)]
    records = read_kafka_stream(spark, settings.bootstrap_servers, topics,
                                max_offsets_per_trigger=max_records_per_trigger,
                                security=settings.security)
    metrics = aggregate(metric_facts(records, settings, watermark), window)
    # Strings, not Paths: the sink may be a URI (s3a://...) on a cluster.
    checkpoint = str(checkpoint or f"{str(sink).rstrip('/')}/_checkpoint")
    writer = (metrics.writeStream.outputMode("update")
              .foreachBatch(lambda frame, batch_id: write_batch(frame, batch_id, sink,
                                                                compact_every))
              .option("checkpointLocation", checkpoint)
              .queryName(f"settlement-monitor-{settings.namespace}"))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


def run(connection_string: str, args: argparse.Namespace) -> int:
    """Run the monitor until interrupted (or, with ``--available-now``, done)."""
    spark = spark_session("settlement-monitor", args.master, ui=True)
    query = start_monitor(spark, connection_string, args.sink, checkpoint=args.checkpoint,
                          trigger_seconds=args.trigger, window=args.window,
                          watermark=args.watermark, available_now=args.available_now,
                          compact_every=args.compact_every)
    log.info("monitor writing to %s", Path(args.sink).resolve())
    print(f"monitor: writing metrics to {Path(args.sink).resolve()} (Ctrl-C stops)")
    if spark.sparkContext.uiWebUrl:  # None where spark-submit turned the UI off
        print(f"monitor: Spark UI at {spark.sparkContext.uiWebUrl}")
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit spark/monitor.py --connection-string ... --sink DIR``"""
    parser = argparse.ArgumentParser(
        prog="monitor", description="Windowed settlement metrics from the engine's topics "
                                    "to Parquet.")
    add_monitor_arguments(parser)
    parser.add_argument("--connection-string",
                        default=os.environ.get("SETTLEMENT_CONNECTION_STRING"))
    args = parser.parse_args(argv)
    if not args.connection_string:
        parser.error("pass --connection-string or set SETTLEMENT_CONNECTION_STRING")
    return run(args.connection_string, args)


if __name__ == "__main__":
    raise SystemExit(main())
