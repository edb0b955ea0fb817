"""The SparkSession of the settlement jobs: local mode here, ``spark-submit``
on a cluster. PySpark needs Java 17; a missing ``java`` is a clear error.

Spark's Kafka connector (``spark-sql-kafka-0-10`` of the installed PySpark's
version) is fetched from Maven Central once, cached like the broker's jars
(``settlement/testing/jars/spark-kafka/pom.xml``), and passed as ``spark.jars``;
where Maven cannot fetch it the session does not start, with the reason."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from settlement.testing.maven import fetch_jars

#: Quiet start-up: warnings that need action only.
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_session(app_name: str = "settlement", master: str = "local[2]") -> SparkSession:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("Java 17 is required by PySpark: install openjdk-17-jre-headless "
                           "(or set JAVA_HOME)")
    # Spark's Python workers must run this interpreter, which has this project.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):  # no lookup of the host's name (and no warning about it)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    spark = (builder
             .config("spark.jars", ",".join(kafka_connector_jars()))
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.extraJavaOptions",
                     f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def kafka_connector_jars() -> list[str]:
    """The jars of Spark's Kafka connector for this PySpark (fetched once;
    :class:`~settlement.testing.maven.JarFetchError` says why it could not be)."""
    directory = fetch_jars("spark-kafka", {"spark.version": pyspark.__version__})
    return sorted(str(jar) for jar in directory.glob("*.jar"))
