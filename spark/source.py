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
    if jvm is None:  # pyspark types the gateway optional: without one nothing loads
        return False
    try:
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(
            "org.apache.spark.sql.kafka010.KafkaSourceProvider")
        return True
    except Exception:  # py4j raises its own error type for ClassNotFoundException
        return False


_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def _profile(bootstrap_servers: str, security: dict[str, str] | None
             ) -> broker_profile.BrokerProfile:
    return broker_profile.detect({"bootstrap.servers": bootstrap_servers, **(security or {}),
                                  "log_level": 0})


def _security_options(fmt: str, security: dict[str, str] | None) -> dict[str, str]:
    """A connection string's security settings (librdkafka names) as options
    of the format: the Java client's names for Spark's connector."""
    if not security:
        return {}
    if fmt != "kafka":
        return {f"kafka.{key}": value for key, value in security.items()}
    mechanism = security.get("sasl.mechanism", "PLAIN")
    options = {"kafka.security.protocol": security.get("security.protocol", "PLAINTEXT"),
               "kafka.sasl.mechanism": mechanism}
    if "sasl.username" in security:
        options["kafka.sasl.jaas.config"] = (
            f'{_LOGIN_MODULES[mechanism]} required username="{security["sasl.username"]}" '
            f'password="{security["sasl.password"]}";')
    if "ssl.ca.location" in security:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = security["ssl.ca.location"]
    return options


def kafka_format(spark: SparkSession, bootstrap_servers: str,
                 security: dict[str, str] | None = None) -> str:
    """``kafka`` (Spark's connector) where the broker's ListOffsets is exact
    and the connector is on the classpath, else the Python source."""
    if not _profile(bootstrap_servers, security).exact_list_offsets:
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
                      max_offsets_per_trigger: int | None = None,
                      security: dict[str, str] | None = None) -> DataFrame:
    """A streaming DataFrame of the records of ``topics``; ``security`` is a
    connection string's (``ConnectionSettings.security``)."""
    fmt = kafka_format(spark, bootstrap_servers, security)
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": ",".join(topics),
               "startingOffsets": starting_offsets, **_security_options(fmt, security)}
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if fmt == PYTHON_FORMAT:
        options["fetchMaxWaitMs"] = str(_profile(bootstrap_servers, security).fetch_max_wait_ms)
    return _load(spark.readStream, fmt, options)


def read_kafka(spark: SparkSession, bootstrap_servers: str, topics: list[str], *,
               security: dict[str, str] | None = None) -> DataFrame:
    """A batch DataFrame of every record of ``topics`` up to their log ends."""
    fmt = kafka_format(spark, bootstrap_servers, security)
    options = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": ",".join(topics),
               **_security_options(fmt, security)}
    return _load(spark.read, fmt, options)
