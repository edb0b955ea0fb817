"""The options of the Spark monitoring job, apart from the job itself so that
the ``settlement monitor`` command (:mod:`spark.cli`) registers them without
loading PySpark, and ``spark-submit spark/monitor.py`` parses the same ones."""

from __future__ import annotations

import argparse


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the monitor, shared with ``spark-submit spark/monitor.py``."""
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
