"""The engine's records as Spark columns: settlement events (``NS.__events``)
and window states (``NS.__state``), both JSON, declared in :mod:`topics.events`.

Used by the monitor (streaming) and by the audit and replay jobs (batch).
Records that are not JSON of the expected shape parse to nulls and are
dropped, so garbage on a topic never stops a job.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark.source import read_kafka
from topics import events, names
from topics.connection import ConnectionSettings
from topics.entities import SubscriptionProperties, load_definition

_SPARK_TYPES: dict[events.FieldType, DataType] = {
    events.FieldType.TEXT: StringType(), events.FieldType.INT: IntegerType(),
    events.FieldType.LONG: LongType(), events.FieldType.LONGS: ArrayType(LongType())}


def spark_schema(fields: tuple[events.Field, ...]) -> StructType:
    """The Spark schema of a record that :mod:`topics.events` declares."""
    return StructType([StructField(f.name, _SPARK_TYPES[f.type]) for f in fields])


EVENT_SCHEMA = spark_schema(events.EVENT_FIELDS)
#: a window's summary; a session's summary also has ``session`` (and
#: ``locked_until``, ``state_size``), with ``active`` its active messages
STATE_SCHEMA = spark_schema(events.STATE_FIELDS)
PAIRING_SCHEMA = spark_schema(events.PAIRING_FIELDS)


def _json(frame: DataFrame, schema: StructType) -> Column:
    return F.from_json(frame["value"].cast("string"), schema)


def parse_events(frame: DataFrame) -> DataFrame:
    """One row per event record: its fields, ``event_time`` and the Kafka position."""
    parsed = frame.select(_json(frame, EVENT_SCHEMA).alias("e"), "topic", "partition", "offset")
    return (parsed.where(F.col("e.type").isNotNull() & F.col("e.entity").isNotNull()
                         & F.col("e.ts").isNotNull())
            .select("e.*", F.col("offset").alias("record_offset"))
            .withColumn("event_time", F.timestamp_millis("ts")))


def parse_states(frame: DataFrame) -> DataFrame:
    """One row per window state record, with ``event_time`` (sessions' own
    summaries left out)."""
    parsed = frame.select(_json(frame, STATE_SCHEMA).alias("s"), F.col("offset"))
    return (parsed.where(F.col("s.entity").isNotNull() & F.col("s.ts").isNotNull()
                         & F.col("s.session").isNull())
            .select("s.*", F.col("offset").alias("record_offset"))
            .withColumn("event_time", F.timestamp_millis("ts")))


#: an event's offsets, those it gives as ``ranges`` too (``[first, end)``
#: runs, flat: see ``topics.runs``), in order
_ALL_OFFSETS = ("concat(coalesce(offsets, array()), coalesce(case when size(ranges) > 0 then "
                "flatten(transform(sequence(0, size(ranges) div 2 - 1), "
                "i -> sequence(ranges[2 * i], ranges[2 * i + 1] - 1))) end, array()))")


def read_events(spark: SparkSession, settings: ConnectionSettings,
                entities: list[str]) -> DataFrame:
    """The events of ``entities`` that name offsets, once per command (batch),
    each with every offset it names in ``offsets`` (those it gives as
    ``ranges`` too).

    A command processed again after a crash publishes the same events again,
    under the same command id."""
    raw = read_kafka(spark, settings.bootstrap_servers, [names.events(settings.namespace)],
                     security=settings.security)
    events = (parse_events(raw)
              .withColumn("offsets", F.expr(_ALL_OFFSETS))
              .where(F.col("entity").isin(entities) & (F.size("offsets") > 0))
              .withColumn("cmd", F.coalesce("cmd", F.concat(F.lit("@"), "record_offset"))))
    return events.dropDuplicates(["cmd", "type", "entity", "partition"])


def read_entity_logs(spark: SparkSession, settings: ConnectionSettings,
                     entities: list[str]) -> DataFrame:
    """The raw message logs of ``entities`` (batch), with an ``entity``
    column. Queues read their own log; each subscription reads its topic's
    from where the subscription began (what was published before is not its)."""
    logs = {entity: names.entity_log(settings.namespace, entity) for entity in entities}
    raw = read_kafka(spark, settings.bootstrap_servers, sorted(set(logs.values())),
                     security=settings.security)
    owners = spark.createDataFrame([(topic, entity) for entity, topic in logs.items()],
                                   "topic string, entity string")
    rows = raw.join(F.broadcast(owners), "topic")
    begins = subscription_begins(spark, settings, entities)
    if not begins:
        return rows
    begin = spark.createDataFrame(begins, "entity string, partition int, begin long")
    return (rows.join(F.broadcast(begin), ["entity", "partition"], "left")
            .where(F.col("begin").isNull() | (F.col("offset") >= F.col("begin")))
            .drop("begin"))


def subscription_begins(spark: SparkSession, settings: ConnectionSettings,
                        entities: list[str]) -> list[tuple[str, int, int]]:
    """``(subscription, partition, first offset)`` of the subscriptions among
    ``entities``, from their definitions' latest records on the entities topic."""
    wanted = sorted(e for e in entities if names.SUBSCRIPTIONS in e)
    if not wanted:
        return []
    raw = read_kafka(spark, settings.bootstrap_servers, [names.entities(settings.namespace)],
                     security=settings.security)
    latest = (raw.select(F.col("key").cast("string").alias("path"), "value", "offset")
              .where(F.col("path").isin(wanted))
              .groupBy("path").agg(F.max_by("value", "offset").alias("value"))
              .where(F.col("value").isNotNull())  # a tombstone: deleted
              .collect())
    found = {}
    for row in latest:
        try:
            found[row.path] = load_definition(bytes(row.value))
        except (ValueError, KeyError, TypeError):
            continue  # unreadable, as the client's registry skips it
    return [(path, partition, offset) for path in wanted
            if isinstance(sub := found.get(path), SubscriptionProperties)
            for partition, offset in enumerate(sub.begin_offsets)]
