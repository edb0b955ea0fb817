"""Reading Kafka topics as a stream, behind one function.

Spark's official ``kafka`` format is used where its connector is on the
classpath (real clusters); otherwise the Python source in
:mod:`spark.kafka_source`. Both give the same columns: key, value, headers,
topic, partition, offset, timestamp. ``read_kafka`` is the batch twin: every
record from the start of the topics to their log ends now.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

COLUMNS = ["key", "value", "headers", "topic", "partition", "offset", "timestamp"]


def kafka_connector_available(spark: SparkSession) -> bool:
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(  # type: ignore[union-attr]
            "org.apache.spark.sql.kafka010.KafkaSourceProvider")
        return True
    except Exception:  # py4j raises its own error type for ClassNotFoundException
        return False


def read_kafka_stream(spark: SparkSession, bootstrap_servers: str, topics: list[str], *,
                      starting_offsets: str = "earliest",
                      max_offsets_per_trigger: int | None = None,
                      fetch_max_wait_ms: int = 100) -> DataFrame:
    """A streaming DataFrame of the records of ``topics``."""
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": ",".join(topics),
               "startingOffsets": starting_offsets}
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if kafka_connector_available(spark):
        frame = (spark.readStream.format("kafka").options(**options)
                 .option("includeHeaders", "true").load())
        return frame.select(*COLUMNS)
    options["fetchMaxWaitMs"] = str(fetch_max_wait_ms)
    return spark.readStream.format("settlement_kafka").options(**options).load()


def read_kafka(spark: SparkSession, bootstrap_servers: str, topics: list[str]) -> DataFrame:
    """A batch DataFrame of every record of ``topics`` up to their log ends."""
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": ",".join(topics)}
    if kafka_connector_available(spark):
        frame = (spark.read.format("kafka").options(**options)
                 .option("includeHeaders", "true").load())
        return frame.select(*COLUMNS)
    return spark.read.format("settlement_kafka").options(**options).load()
