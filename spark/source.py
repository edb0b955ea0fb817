"""Reading Kafka topics as a stream, behind one function.

The jobs read through Spark's official ``kafka`` format
(``spark-sql-kafka-0-10``, put on the classpath by :mod:`spark.session`), on
Apache Kafka. (Tansu is not a target of the Spark jobs: its ListOffsets
answers the last batch's base offset + 1, not the log end, so the connector
would stop short of the end: see the README's compatibility table.) The
columns are key, value, headers, topic, partition, offset, timestamp.
``read_kafka`` is the batch twin: every record from the start of the topics
to their log ends.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql.streaming import DataStreamReader

from topics.connection import SYSTEM_CAS

COLUMNS = ["key", "value", "headers", "topic", "partition", "offset", "timestamp"]

_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def _security_options(security: dict[str, str] | None) -> dict[str, str]:
    """A connection string's security settings (librdkafka names) as options
    of Spark's connector (the Java client's names)."""
    if not security:
        return {}
    mechanism = security.get("sasl.mechanism", "PLAIN")
    options = {"kafka.security.protocol": security.get("security.protocol", "PLAINTEXT"),
               "kafka.sasl.mechanism": mechanism}
    if "sasl.username" in security:
        options["kafka.sasl.jaas.config"] = (
            f'{_LOGIN_MODULES[mechanism]} required username="{security["sasl.username"]}" '
            f'password="{security["sasl.password"]}";')
    if security.get("ssl.ca.location", SYSTEM_CAS) != SYSTEM_CAS:
        # a private CA's PEM file (Kafka's Java client reads PEM trust stores);
        # otherwise the JVM's own CAs, as librdkafka's "probe" means the system's
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = security["ssl.ca.location"]
    return options


def _load(reader: DataFrameReader | DataStreamReader, bootstrap_servers: str,
          topics: list[str], security: dict[str, str] | None,
          options: dict[str, str]) -> DataFrame:
    return (reader.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap_servers)
            .option("subscribe", ",".join(topics))
            .option("includeHeaders", "true")
            .options(**_security_options(security), **options)
            .load().select(*COLUMNS))


def read_kafka_stream(spark: SparkSession, bootstrap_servers: str, topics: list[str], *,
                      starting_offsets: str = "earliest",
                      max_offsets_per_trigger: int | None = None,
                      security: dict[str, str] | None = None) -> DataFrame:
    """A streaming DataFrame of the records of ``topics``; ``security`` is a
    connection string's (``ConnectionSettings.security``)."""
    options = {"startingOffsets": starting_offsets}
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    return _load(spark.readStream, bootstrap_servers, topics, security, options)


def read_kafka(spark: SparkSession, bootstrap_servers: str, topics: list[str], *,
               security: dict[str, str] | None = None) -> DataFrame:
    """A batch DataFrame of every record of ``topics`` up to their log ends:
    what is there when each partition is read. Records that went meanwhile
    are skipped, not an error (``failOnDataLoss``): the engine trims entity
    logs and Kafka compacts the others while a query runs, and the audit
    judges offsets below a log's start as trimmed."""
    return _load(spark.read, bootstrap_servers, topics, security,
                 {"failOnDataLoss": "false"})
