"""The options of the Spark jobs, apart from the jobs so that the
``settlement`` commands (:mod:`spark.cli`) register them without loading
PySpark, and ``spark-submit spark/monitor.py`` parses the same ones."""

from __future__ import annotations

import argparse


def add_master_argument(parser: argparse.ArgumentParser) -> None:
    """``--master``, the Spark master a job runs on (see :mod:`spark.session`)."""
    parser.add_argument("--master", metavar="URL",
                        help="Spark master, e.g. spark://HOST:7077 (default: the one "
                             "spark-submit was given, else $SPARK_MASTER, else local[2])")


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the monitor, shared with ``spark-submit spark/monitor.py``."""
    add_master_argument(parser)
    parser.add_argument("--sink", default="monitor-data",
                        help="directory of the Parquet results and the checkpoint")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: SINK/_checkpoint)")
    parser.add_argument("--trigger", type=float, default=2.0, metavar="SECONDS",
                        help="micro-batch interval (default: 2)")
    parser.add_argument("--window", default="10 seconds",
                        help="event-time window length (default: 10 seconds)")
    parser.add_argument("--watermark", default="1 minute",
                        help="how late an event may arrive and still count (default: 1 minute)")
    parser.add_argument("--available-now", action="store_true",
                        help="process what is in the topics now, then stop")
    parser.add_argument("--compact-every", type=int, default=100, metavar="BATCHES",
                        help="merge the sink's older batches into one file this often "
                             "(default: 100; 0: never)")
