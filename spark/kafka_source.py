"""A Kafka streaming source for Spark written on PySpark's Python Data Source
API, over confluent-kafka: used where Spark's own ``kafka`` connector jar is
not on the classpath (the embedded broker here; it cannot be downloaded).

Offsets are kept per topic and partition in the checkpoint (``{"topic":
{"0": next_offset}}``), so a restarted query reads on from where it stopped,
neither losing nor repeating records. ``maxOffsetsPerTrigger`` caps a
micro-batch (admission control, Spark 4.2+); ``Trigger.AvailableNow`` reads
what is there and stops. Log ends come from fetch responses
(:mod:`topics.offsets`), since some brokers answer ListOffsets low.

The same source reads in batch (``spark.read``): every record from the start
of each topic to its log end when the query starts (replay and audit jobs).

Options: ``kafka.bootstrap.servers``, ``subscribe`` (comma-separated topics),
``startingOffsets`` (``earliest`` | ``latest``), ``maxOffsetsPerTrigger``,
``fetchMaxWaitMs``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from topics.offsets import log_end_offsets, take

SCHEMA = ("key binary, value binary, headers array<struct<key: string, value: binary>>, "
          "topic string, partition int, offset long, timestamp timestamp")
Offsets = dict[str, dict[str, int]]


class KafkaSource(DataSource):
    """``spark.readStream.format("settlement_kafka")``"""

    @classmethod
    def name(cls) -> str:
        return "settlement_kafka"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Spark hands options over case-insensitively (lower-cased keys).
        return KafkaStreamReader({k.lower(): v for k, v in self.options.items()})

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader({k.lower(): v for k, v in self.options.items()})


class TopicRange(InputPartition):
    """The records of one topic partition between two offsets."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class _KafkaReading:
    """What the batch and the stream reader share: the topics, their log ends
    and reading one offset range."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = options
        self._bootstrap = options["kafka.bootstrap.servers"]
        self._topics = [t.strip() for t in options["subscribe"].split(",") if t.strip()]

    def _consumer(self) -> Consumer:
        security = {key[len("kafka."):]: value for key, value in self._options.items()
                    if key.startswith("kafka.") and key != "kafka.bootstrap.servers"}
        return Consumer({
            **security,
            "bootstrap.servers": self._bootstrap, "group.id": f"spark-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": int(self._options.get("fetchmaxwaitms", "100")),
        })

    def _ends(self) -> Offsets:
        consumer = self._consumer()
        try:
            metadata = consumer.list_topics(timeout=10).topics
            parts = [(t, p) for t in self._topics if t in metadata
                     for p in metadata[t].partitions]
            # This source serves the embedded broker, whose ListOffsets is not exact.
            ends = log_end_offsets(consumer, parts, exact=False) if parts else {}
        finally:
            consumer.close()
        out: Offsets = {t: {} for t in self._topics}
        for (topic, partition), end in ends.items():
            out[topic][str(partition)] = end
        return out

    def _read_range(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records as Arrow batches: Spark takes them without a row-by-row
        conversion in Python, several times faster than yielding tuples."""
        if not isinstance(partition, TopicRange):
            return  # nothing to read: Spark hands a placeholder when partitions() is empty
        consumer = self._consumer()
        try:
            consumer.assign([TopicPartition(partition.topic, partition.partition,
                                            partition.start)])
            position = partition.start
            while position < partition.end:
                records = [r for r in take(consumer, 2000, 1.0)
                           if r.error() is None and _offset(r) < partition.end]
                if records:
                    position = _offset(records[-1]) + 1
                    yield _arrow_batch(records)
        finally:
            consumer.close()



def _offset(record: Message) -> int:
    offset = record.offset()
    # confluent-kafka types it optional for messages not yet produced.
    assert offset is not None, "a record the consumer fetched has an offset"
    return offset


class KafkaStreamReader(_KafkaReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._starting = options.get("startingoffsets", "earliest")
        if self._starting not in ("earliest", "latest"):
            raise ValueError(f"startingOffsets must be earliest or latest, got {self._starting!r}")
        cap = options.get("maxoffsetspertrigger")
        self._max_per_trigger = int(cap) if cap else None
        self._target: Offsets | None = None  # Trigger.AvailableNow: read up to here

    def initialOffset(self) -> Offsets:
        ends = self._ends()
        if self._starting == "latest":
            return ends
        return {t: {p: 0 for p in parts} for t, parts in ends.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._max_per_trigger:
            return ReadMaxRows(self._max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """What is there now is all this query reads, in capped micro-batches."""
        self._target = self._ends()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        ends = self._target if self._target is not None else self._ends()
        # Partitions that appeared since the start are read from their beginning.
        begin = {t: {p: start.get(t, {}).get(p, 0) for p in parts} for t, parts in ends.items()}
        if isinstance(limit, ReadMaxRows):
            return _cap(begin, ends, limit.max_rows)
        if self._target is not None and self._max_per_trigger:
            return _cap(begin, ends, self._max_per_trigger)
        return ends

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        for topic, parts in end.items():
            for partition, stop in parts.items():
                first = start.get(topic, {}).get(partition, 0)
                if stop > first:
                    ranges.append(TopicRange(topic, int(partition), first, stop))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return self._read_range(partition)

    def commit(self, end: Offsets) -> None:
        """Kafka keeps the data; the checkpoint keeps the offsets."""


class KafkaBatchReader(_KafkaReading, DataSourceReader):
    """Every record from the start of each partition to its log end now."""

    def partitions(self) -> list[InputPartition]:
        return [TopicRange(topic, int(partition), 0, end)
                for topic, parts in self._ends().items()
                for partition, end in parts.items() if end > 0]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return self._read_range(partition)


def _cap(begin: Offsets, ends: Offsets, max_rows: int) -> Offsets:
    """At most ``max_rows`` records in all, shared fairly among partitions."""
    pending = [(t, p, begin[t][p], ends[t][p]) for t in ends for p in ends[t]
               if ends[t][p] > begin[t][p]]
    out = {t: dict(parts) for t, parts in begin.items()}
    budget = max_rows
    while pending and budget > 0:
        share = max(1, budget // len(pending))
        still = []
        for topic, partition, first, last in pending:
            take_n = min(share, last - first, budget)
            out[topic][partition] = first + take_n
            budget -= take_n
            if first + take_n < last:
                still.append((topic, partition, first + take_n, last))
            if budget == 0:
                break
        pending = still
    return out


ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
])


def _arrow_batch(records: list[Any]) -> pa.RecordBatch:
    stamps = [r.timestamp() for r in records]
    return pa.RecordBatch.from_arrays([
        pa.array([r.key() for r in records], pa.binary()),
        pa.array([r.value() for r in records], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in r.headers() or []] for r in records],
                 ARROW_SCHEMA.field("headers").type),
        pa.array([r.topic() for r in records], pa.string()),
        pa.array([r.partition() for r in records], pa.int32()),
        pa.array([r.offset() for r in records], pa.int64()),
        pa.array([millis * 1000 if kind else None for kind, millis in stamps],
                 pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)
