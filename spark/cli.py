"""The Spark commands of the ``settlement`` CLI: monitor, dashboard, replay.

Kept apart from the jobs so that the ``settlement`` command never imports
PySpark (seconds of start-up) unless a Spark command runs: each handler
imports its job when called.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from settlement.client import ServiceBusClient
from settlement.management import ServiceBusAdministrationClient
from spark.monitor_options import add_master_argument, add_monitor_arguments

ConnectionString = Callable[[argparse.Namespace], str]


def add_commands(commands: Any, common: argparse.ArgumentParser,
                 connection_string: ConnectionString) -> None:
    """Register the Spark sub-commands on the ``settlement`` parser."""
    _add_monitor(commands, common, connection_string)
    _add_dashboard(commands, common)
    _add_replay(commands, common, connection_string)


def _add_monitor(commands: Any, common: argparse.ArgumentParser,
                 connection_string: ConnectionString) -> None:
    monitor = commands.add_parser(
        "monitor", parents=[common], help="run the Spark monitoring job",
        description="Windowed settlement metrics (outcomes per entity, dead-letter reasons, "
                    "lock-time percentiles, end-to-end latency, delivery counts, gauges) "
                    "from the engine's topics to Parquet, with a checkpoint.")
    add_monitor_arguments(monitor)

    def handler(args: argparse.Namespace) -> int:
        # Imported here, not at the top: it loads PySpark, only this command needs it.
        from spark.monitor import run

        return run(connection_string(args), args)

    monitor.set_defaults(handler=handler)


def _add_dashboard(commands: Any, common: argparse.ArgumentParser) -> None:
    dashboard = commands.add_parser(
        "dashboard", parents=[common], help="serve the monitor's results as a web page",
        description="A page of charts (outcome rates over time, dead-letters by reason, "
                    "lock-time percentiles, backlog per entity) and exact totals, read from "
                    "the monitor's Parquet sink; it reloads itself. Also /metrics.json, and "
                    "/metrics for Prometheus.")
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
        # Imported here, not at the top: it loads pandas, only this command needs it.
        from spark.dashboard import run

        return run(args)

    dashboard.set_defaults(handler=handler)


def _add_replay(commands: Any, common: argparse.ArgumentParser,
                connection_string: ConnectionString) -> None:
    replay = commands.add_parser(
        "replay", parents=[common], help="Spark batch jobs: replay dead letters or a time "
                                         "range, audit the engine",
        description="Spark batch jobs over the raw logs and the engine's event stream.")
    sub = replay.add_subparsers(title="jobs", metavar="JOB")
    replay.set_defaults(parser=replay)
    when = argparse.ArgumentParser(add_help=False)
    when.add_argument("--since", type=_utc, metavar="ISO-TIME", help="from this time on (UTC "
                                                                     "unless it says)")
    when.add_argument("--until", type=_utc, metavar="ISO-TIME", help="before this time")
    spark = argparse.ArgumentParser(add_help=False)
    add_master_argument(spark)

    dlq = sub.add_parser("dlq", parents=[common, spark, when], help="resubmit dead letters, once",
                         description="Resubmit the dead letters of QUEUE that match --reason "
                                     "and were dead-lettered in [--since, --until), to --to "
                                     "(default: QUEUE). Copies carry the application property "
                                     "replayed_from; running it again resubmits nothing more.")
    dlq.add_argument("queue", metavar="QUEUE")
    dlq.add_argument("--reason", help="only dead letters with this dead-letter reason")
    dlq.add_argument("--to", metavar="QUEUE", help="send the copies here instead")

    def run_dlq(args: argparse.Namespace) -> int:
        # Imported here, not at the top: it loads PySpark, only this command needs it.
        from spark.replay import replay_dlq

        count = _with_client(args, connection_string, lambda spark, client, bar: replay_dlq(
            spark, client, connection_string(args), args.queue, reason=args.reason,
            since=args.since, until=args.until, to=args.to, on_progress=bar.update))
        print(f"resubmitted {count} dead letter(s) of {args.queue!r} to {args.to or args.queue!r}")
        return 0

    dlq.set_defaults(handler=run_dlq)

    ranged = sub.add_parser("range", parents=[common, spark, when],
                            help="re-publish a time range of a queue's log to another queue",
                            description="Re-publish the messages QUEUE received in [--since, "
                                        "--until) to --to, once (copies carry replayed_from).")
    ranged.add_argument("queue", metavar="QUEUE")
    ranged.add_argument("--to", metavar="QUEUE", required=True, help="the target queue")

    def run_range(args: argparse.Namespace) -> int:
        # Imported here, not at the top: it loads PySpark, only this command needs it.
        from spark.replay import replay_range

        if args.since is None:
            raise ValueError("replay range needs --since (an ISO time)")
        count = _with_client(args, connection_string, lambda spark, client, bar: replay_range(
            spark, client, connection_string(args), args.queue, args.to, since=args.since,
            until=args.until, on_progress=bar.update))
        print(f"re-published {count} message(s) of {args.queue!r} to {args.to!r}")
        return 0

    ranged.set_defaults(handler=run_range)

    audit = sub.add_parser("audit", parents=[common, spark], help="check the engine's bookkeeping",
                           description="Rebuild every message's final state from the raw log "
                                       "and the events; compare with the state topic. Exit "
                                       "status 1 when messages are lost, stuck, doubly "
                                       "settled or inconsistent.")
    audit.add_argument("queues", metavar="QUEUE", nargs="*",
                       help="queues to audit (default: all)")
    audit.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                       help="how long past its end a lock may stay unlapsed (default: 30)")

    def run_audit(args: argparse.Namespace) -> int:
        # Imported here, not at the top: they load PySpark, only this command needs it.
        from spark.audit import run_audit as audit_entities
        from spark.session import spark_session

        conn = connection_string(args)
        queues = args.queues
        if not queues:
            with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
                queues = [q.name for q in admin.list_queues()]
        report = audit_entities(spark_session("settlement-audit", args.master), conn, queues,
                                grace_ms=int(args.grace * 1000))
        print(report.summary())
        return 0 if report.ok else 1

    audit.set_defaults(handler=run_audit)


def _utc(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _with_client(args: argparse.Namespace, connection_string: ConnectionString,
                 job: Callable[[Any, Any, Any], int]) -> int:
    """Run ``job(spark, client, progress_bar)``."""
    # Imported here, not at the top: it loads PySpark, only the replay jobs need it.
    from spark.session import spark_session

    spark = spark_session("settlement-replay", args.master)
    with ServiceBusClient.from_connection_string(connection_string(args)) as client, \
            tqdm(unit="msg", desc="sent", disable=None) as bar:
        return job(spark, client, bar)
