"""The Spark commands of the ``settlement`` CLI: monitor, dashboard, replay.

Kept apart from :mod:`settlement.cli` so that the client's CLI never imports
PySpark (seconds of start-up) unless a Spark command runs: each handler
imports its job when called.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

ConnectionString = Callable[[argparse.Namespace], str]


def add_commands(commands: Any, common: argparse.ArgumentParser,
                 connection_string: ConnectionString) -> None:
    """Register the Spark sub-commands on the ``settlement`` parser."""
    _add_monitor(commands, common, connection_string)
    _add_dashboard(commands, common)


def _add_monitor(commands: Any, common: argparse.ArgumentParser,
                 connection_string: ConnectionString) -> None:
    monitor = commands.add_parser(
        "monitor", parents=[common], help="run the Spark monitoring job",
        description="Windowed settlement metrics (outcomes per entity, dead-letter reasons, "
                    "lock-time percentiles, end-to-end latency, delivery counts, gauges) "
                    "from the engine's topics to Parquet, with a checkpoint.")
    add_monitor_arguments(monitor)

    def handler(args: argparse.Namespace) -> int:
        from spark.monitor import run

        return run(connection_string(args), args)

    monitor.set_defaults(handler=handler)


def _add_dashboard(commands: Any, common: argparse.ArgumentParser) -> None:
    dashboard = commands.add_parser(
        "dashboard", parents=[common], help="serve the monitor's results as a web page",
        description="A page of charts (outcome rates over time, dead-letters by reason, "
                    "lock-time percentiles, backlog per entity) and exact totals, read from "
                    "the monitor's Parquet sink; it reloads itself. Also /metrics.json.")
    dashboard.add_argument("--sink", default="monitor-data",
                           help="the monitor's --sink directory (default: monitor-data)")
    dashboard.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    dashboard.add_argument("--port", type=int, default=8050, help="default: 8050")
    dashboard.add_argument("--refresh", type=int, default=5, metavar="SECONDS",
                           help="the page reloads itself this often (default: 5)")
    dashboard.add_argument("--output", metavar="FILE",
                           help="write the page to FILE once and exit instead of serving")
    dashboard.add_argument("--screenshot", metavar="PNG",
                           help="save a headless Chromium screenshot of the page and exit")

    def handler(args: argparse.Namespace) -> int:
        from spark.dashboard import run

        return run(args)

    dashboard.set_defaults(handler=handler)


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
