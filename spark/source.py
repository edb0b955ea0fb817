"""Reading Kafka topics as a stream, behind one function.

On Apache Kafka the jobs read through Spark's official ``kafka`` format
(``spark-sql-kafka-0-10``, put on the classpath by :mod:`spark.session`). It
takes log ends from ListOffsets, which the embedded broker (Tansu) answers
wrongly, so there the Python source in :mod:`spark.kafka_source` reads
instead; which one is chosen follows the broker's profile
(:mod:`topics.broker_profile`), not a setting. Both give the same columns:
key, value, headers, topic, partition, offset, timestamp. ``read_kafka`` is
the batch twin: every record from the start of the topics to their log ends.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql.streaming import DataStreamReader

from topics import broker_profile

log = logging.getLogger(__name__)
COLUMNS = ["key", "value", "headers", "topic", "partition", "offset", "timestamp"]
#: The Python source's name (registered by :func:`spark.session.spark_session`).
PYTHON_FORMAT = "settlement_kafka"


def kafka_connector_available(spark: SparkSession) -> bool:
    """Whether Spark can load its Kafka connector: jars of ``spark.jars`` are
    on the context class loader, not on the JVM's own class path."""
    jvm = spark.sparkContext._jvm
    try:
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(  # type: ignore[union-attr]
            "org.apache.spark.sql.kafka010.KafkaSourceProvider")
        return True
    except Exception:  # py4j raises its own error type for ClassNotFoundException
        return False


def _profile(bootstrap_servers: str) -> broker_profile.BrokerProfile:
    return broker_profile.detect({"bootstrap.servers": bootstrap_servers, "log_level": 0})


def kafka_format(spark: SparkSession, bootstrap_servers: str) -> str:
    """``kafka`` (Spark's connector) where the broker's ListOffsets is exact
    and the connector is on the classpath, else the Python source."""
    if not _profile(bootstrap_servers).exact_list_offsets:
        return PYTHON_FORMAT
    if kafka_connector_available(spark):
        return "kafka"
    log.warning("Spark's Kafka connector is not on this session's classpath: reading %s "
                "through the Python source (build the session with spark.session."
                "spark_session, or add spark-sql-kafka-0-10 to spark.jars)", bootstrap_servers)
    return PYTHON_FORMAT


def _load(reader: DataFrameReader | DataStreamReader, fmt: str,
          options: dict[str, str]) -> DataFrame:
    if fmt == "kafka":
        return reader.format("kafka").options(**options).option("includeHeaders", "true") \
            .load().select(*COLUMNS)
    return reader.format(fmt).options(**options).load()


def read_kafka_stream(spark: SparkSession, bootstrap_servers: str, topics: list[str], *,
                      starting_offsets: str = "earliest",
                      max_offsets_per_trigger: int | None = None) -> DataFrame:
    """A streaming DataFrame of the records of ``topics``."""
    fmt = kafka_format(spark, bootstrap_servers)
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": ",".join(topics),
               "startingOffsets": starting_offsets}
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if fmt == PYTHON_FORMAT:
        options["fetchMaxWaitMs"] = str(_profile(bootstrap_servers).fetch_max_wait_ms)
    return _load(spark.readStream, fmt, options)


def read_kafka(spark: SparkSession, bootstrap_servers: str, topics: list[str]) -> DataFrame:
    """A batch DataFrame of every record of ``topics`` up to their log ends."""
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": ",".join(topics)}
    return _load(spark.read, kafka_format(spark, bootstrap_servers), options)
