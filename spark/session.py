"""The SparkSession of the settlement jobs, in local mode or on a cluster.
PySpark needs Java 17; a missing ``java`` is a clear error.

The master is, in this order: the job's ``--master`` option; the one
``spark-submit`` chose (it started this Python) or ``PYSPARK_SUBMIT_ARGS``
names; ``$SPARK_MASTER``; else ``local[2]``. Settings given to ``spark-submit``
(``--conf``) win over the defaults here too.

Spark's Kafka connector (``spark-sql-kafka-0-10`` of the installed PySpark's
version) comes by its Maven coordinates, ``spark.jars.packages``: Spark's Ivy
takes it from the local Maven cache (``~/.m2/repository``) where it is there,
else from Maven Central once, into an Ivy cache next to the broker's jars
(:func:`settlement.testing.maven.cache_dir`). Packages, not jar paths, because
Spark then puts the jars on the driver's class path *and* ships them to the
executors of a cluster. Under ``spark-submit`` pass ``--packages`` yourself:
the JVM has started by the time this code runs, too late to add a package.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from settlement.testing.maven import cache_dir, cache_lock

#: Quiet start-up: warnings that need action only.
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
#: The master when nothing names one: this machine, two cores.
LOCAL_MASTER = "local[2]"
#: Spark's Kafka connector of this PySpark (Scala 2.13, like PySpark's own jars).
KAFKA_PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
#: The connector's dependencies that PySpark already ships (``pyspark/jars``, the
#: same versions): without them Ivy would fetch and copy 60 MB more, and need
#: Maven Central for some of them, where the Maven cache has the rest.
SHIPPED_WITH_PYSPARK = ",".join([
    "org.apache.hadoop:hadoop-client-runtime", "org.apache.hadoop:hadoop-client-api",
    "at.yawk.lz4:lz4-java", "org.xerial.snappy:snappy-java", "org.slf4j:slf4j-api",
    "com.google.code.findbugs:jsr305", "org.scala-lang.modules:scala-parallel-collections_2.13"])


def spark_session(app_name: str = "settlement", master: str | None = None, *,
                  ui: bool = False) -> SparkSession:
    """The jobs' session on ``master`` (see the module docstring for the
    default); ``ui``: serve the Spark UI (4040, or the next free port)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("Java 17 is required by PySpark: install openjdk-17-jre-headless "
                           "(or set JAVA_HOME)")
    # Spark's Python workers must run this interpreter, which has this project.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = _submitted_conf()
    ivy_cache = cache_dir() / "ivy"
    master = master or _chosen_master(submitted)
    if master is not None and master.startswith("local"):
        # no lookup of the host's name (and no warning about it)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    defaults = {
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}",
        "spark.sql.session.timeZone": "UTC",
    }
    if submitted is None:
        defaults |= {"spark.jars.packages": KAFKA_PACKAGE,
                     "spark.jars.excludes": SHIPPED_WITH_PYSPARK,
                     "spark.jars.ivy": str(ivy_cache)}
    else:
        _require_connector(submitted)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in defaults.items():
        if submitted is None or not submitted.contains(key):
            builder = builder.config(key, value)
    # Unless spark-submit started it, the JVM starts here and its Ivy fills
    # the cache shared with other processes: one at a time.
    with cache_lock(ivy_cache) if submitted is None else contextlib.nullcontext():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _submitted_conf() -> SparkConf | None:
    """The settings ``spark-submit`` started this Python with, or None when
    it did not (then PySpark starts the JVM with the builder's settings)."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set by spark-submit for a Python app
        return None
    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    return SparkConf()  # loads that JVM's spark.* properties


def _chosen_master(submitted: SparkConf | None) -> str | None:
    """``None`` where ``spark-submit`` chose the master (it must stay), else
    ``$SPARK_MASTER`` or :data:`LOCAL_MASTER`."""
    if submitted is not None and submitted.contains("spark.master"):
        return None
    if "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "").split():
        return None
    return os.environ.get("SPARK_MASTER") or LOCAL_MASTER


def _require_connector(submitted: SparkConf) -> None:
    jars = submitted.get("spark.jars.packages", "") + submitted.get("spark.jars", "")
    if "spark-sql-kafka-0-10" not in jars:
        raise RuntimeError(f"spark-submit was not given Spark's Kafka connector: pass "
                           f"--packages {KAFKA_PACKAGE}")
