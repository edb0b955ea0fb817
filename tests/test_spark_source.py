"""The Kafka source behind spark.source.read_kafka_stream, with real Spark:
Spark's own connector on Apache Kafka."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark.source import COLUMNS, read_kafka_stream
from tests.helpers import Broker

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pyspark = pytest.importorskip("pyspark")


def make_topic(broker: Broker, records: int, partitions: int = 2) -> str:
    topic = f"spark-src-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    produce(broker, topic, 0, records)
    return topic


def produce(broker: Broker, topic: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(first, first + count):
        producer.produce(topic, f"value-{i}".encode(), key=f"k{i % 7}".encode(),
                         headers=[("n", str(i).encode())])
    assert producer.flush(10) == 0


def consumed(broker: Broker, topic: str, partitions: int = 2) -> set[tuple]:
    """What a plain consumer reads: (partition, offset, key, value, headers)."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    rows: set[tuple] = set()
    for _ in range(50):
        for r in consumer.consume(1000, timeout=0.2):
            if r.error() is None:
                rows.add((r.partition(), r.offset(), r.key(), r.value(),
                          tuple((k, v) for k, v in r.headers() or [])))
    consumer.close()
    return rows


def run_available_now(spark: SparkSession, broker: Broker, topic: str, out: Path, *,
                      starting_offsets: str = "earliest",
                      max_offsets_per_trigger: int | None = None) -> list[int]:
    """Stream ``topic`` into Parquet at ``out`` until caught up; micro-batch sizes."""
    sizes: list[int] = []

    def write(batch: DataFrame, _batch_id: int) -> None:
        sizes.append(batch.count())
        batch.write.mode("append").parquet(str(out / "data"))

    frame = read_kafka_stream(spark, broker.bootstrap, [topic],
                              starting_offsets=starting_offsets,
                              max_offsets_per_trigger=max_offsets_per_trigger)
    query = (frame.writeStream.foreachBatch(write)
             .option("checkpointLocation", str(out / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    return sizes


def rows_of(spark: SparkSession, out: Path) -> list[tuple]:
    frame = spark.read.parquet(str(out / "data"))
    return [(r.partition, r.offset, bytes(r.key), bytes(r.value),
             tuple((h.key, bytes(h.value)) for h in r.headers)) for r in frame.collect()]


def test_the_source_reads_what_a_plain_consumer_reads(
        spark: SparkSession, broker: Broker, tmp_path: Path) -> None:
    topic = make_topic(broker, 300)
    run_available_now(spark, broker, topic, tmp_path)
    rows = rows_of(spark, tmp_path)
    assert len(rows) == 300 and set(rows) == consumed(broker, topic)
    columns = spark.read.parquet(str(tmp_path / "data")).columns
    assert columns == COLUMNS


def test_restart_from_checkpoint_reads_on_without_loss_or_double_reads(
        spark: SparkSession, broker: Broker, tmp_path: Path) -> None:
    topic = make_topic(broker, 120)
    run_available_now(spark, broker, topic, tmp_path)
    produce(broker, topic, 120, 80)
    run_available_now(spark, broker, topic, tmp_path)
    offsets = [(p, o) for p, o, *_ in rows_of(spark, tmp_path)]
    assert len(offsets) == 200 and len(set(offsets)) == 200


def test_max_offsets_per_trigger_caps_each_micro_batch(
        spark: SparkSession, broker: Broker, tmp_path: Path) -> None:
    topic = make_topic(broker, 200)
    sizes = run_available_now(spark, broker, topic, tmp_path, max_offsets_per_trigger=50)
    assert sum(sizes) == 200 and max(sizes) <= 50 and len(sizes) >= 4


def test_starting_offsets_latest_skips_what_is_there(
        spark: SparkSession, broker: Broker, tmp_path: Path) -> None:
    topic = make_topic(broker, 50)
    sizes = run_available_now(spark, broker, topic, tmp_path, starting_offsets="latest")
    assert sum(sizes) == 0
