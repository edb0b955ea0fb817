"""``settlement pair status``: where the sends of a namespace's paired clients
go, and what waits in its backlog queues on the secondary namespace::

    settlement pair status --connection-string "$PRIMARY" --secondary "$SECONDARY"
    settlement pair status --connection-string "$PRIMARY" --secondary "$SECONDARY" \\
        --backlog-queue-count 10

It reads the secondary only: the status records paired clients publish to its
compacted ``NS.__pairing`` topic (:func:`settlement.pairing.read_status`) and
the counts of the backlog queues. The primary's connection string gives the
namespace's name and is not connected to, so the command answers while the
primary is away, which is when it is wanted.

Apart from :mod:`settlement.cli.app`, which registers it, with the printers of
:mod:`settlement.cli.output`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from typing import Any

from settlement.cli.base import UsageError, add_command, add_group
from settlement.cli.output import Column, format_table, print_listing
from settlement.management import ServiceBusAdministrationClient
from settlement.pairing import backlog_queue_names, read_status
from topics import names
from topics.connection import ConnectionSettings, parse_connection_string

ConnectionString = Callable[[argparse.Namespace], str]

#: One row per entity and client, from its latest status record. A record in
#: ``primary`` mode was published when the entity switched back, at ``ts``;
#: one in ``closed`` mode, when the client closed while in the backlog.
STATUS_COLUMNS: list[Column] = [
    ("KIND", lambda s: s["kind"]), ("ENTITY", lambda s: s["entity"]),
    ("CLIENT", lambda s: s["client"]), ("SENDS TO", lambda s: s["mode"]),
    ("SINCE (UTC)", lambda s: _since(s)), ("FAILOVERS", lambda s: s["failovers"]),
    ("SENT TO BACKLOG", lambda s: s["sent_to_backlog"]),
    ("REPORTED (UTC)", lambda s: _utc_ms(s["ts"]))]


def add_commands(commands: Any, common: argparse.ArgumentParser,
                 connection_string: ConnectionString) -> None:
    """Register ``pair status``."""
    sub = add_group(commands, common, "pair", "status",
                    "Paired namespaces for send availability: a client paired with a "
                    "secondary namespace sends to backlog queues there while the primary "
                    "(--connection-string) is away.")
    status = add_command(
        sub, common, "status", lambda args: cmd_pair_status(args, connection_string(args)),
        "where paired clients send, and the backlog",
        "Per entity of the primary and paired client: whether its sends go to the primary "
        "or to the backlog and since when, its failovers and the messages it sent to the "
        "backlog, as the client last reported them (at a failover, every 5 s while in the "
        "backlog, at a switch back, and when it closed while in the backlog); "
        "then each backlog queue on the secondary with the messages waiting in it. Reads "
        "the secondary only, so it answers while the primary is away.")
    status.add_argument("--secondary", required=True, metavar="CONN",
                        help="connection string of the secondary namespace")
    status.add_argument("--backlog-queue-count", type=int, default=None, metavar="N",
                        help="show backlog queues 0..N-1, created or not (default: those "
                             "that exist)")


def cmd_pair_status(args: argparse.Namespace, primary_conn: str) -> int:
    primary = parse_connection_string(primary_conn)
    secondary = parse_connection_string(args.secondary)
    if (secondary.bootstrap_servers, secondary.namespace) == (
            primary.bootstrap_servers, primary.namespace):
        raise UsageError("--secondary names the primary namespace itself: give the "
                         "connection string of the namespace it is paired with")
    count = args.backlog_queue_count
    if count is not None and count < 1:
        raise UsageError(f"--backlog-queue-count must be at least 1, got {count}")
    print_status(primary.namespace, secondary, count)
    return 0


def print_status(primary_namespace: str, secondary: ConnectionSettings,
                 count: int | None = None) -> None:
    """The two tables of ``settlement pair status`` (the demo prints them too)."""
    # fails first if the secondary is away
    with ServiceBusAdministrationClient._from_settings(secondary) as admin:
        depths = backlog_depths(admin, primary_namespace, count)
    statuses = read_status(secondary, primary_namespace)
    where = f"namespace {secondary.namespace!r} at {secondary.bootstrap_servers}"
    if statuses:
        print(f"Paired clients of namespace {primary_namespace!r} (status records on "
              f"{names.pairing(secondary.namespace)!r} of {where})")
    print_listing(f"paired client of namespace {primary_namespace!r} has reported to {where}",
                  statuses, STATUS_COLUMNS)
    if not depths:
        print(f"no backlog queues of namespace {primary_namespace!r} on {where}",
              file=sys.stderr)
        return
    waiting = sum(d for _, d in depths if d is not None)
    print()
    print(f"Backlog queues of namespace {primary_namespace!r} on {where}")
    print(format_table(["QUEUE", "ACTIVE MESSAGES"],
                       [[queue, "not created" if depth is None else str(depth)]
                        for queue, depth in depths] + [["total", str(waiting)]]))


def backlog_depths(admin: ServiceBusAdministrationClient, primary_namespace: str,
                   count: int | None) -> list[tuple[str, int | None]]:
    """Each backlog queue of ``primary_namespace`` with its active messages
    (None: not created): queues ``0..count-1``, or without ``count`` those
    that exist, in order."""
    existing = {q.name for q in admin.list_queues()}
    if count is None:
        queues = sorted((q for q in existing
                         if names.primary_of_backlog_queue(q) == primary_namespace),
                        key=lambda q: int(q.rpartition(".")[2]))
    else:
        queues = backlog_queue_names(primary_namespace, count)
    return [(queue, admin.get_queue_runtime_properties(queue).active_message_count
             if queue in existing else None) for queue in queues]


def _since(status: dict[str, object]) -> dt.datetime:
    """When the entity's sends went where they go now: its failover, or the
    switch back (when a ``primary`` record is published)."""
    since = status.get("since")
    if isinstance(since, str):
        return dt.datetime.fromisoformat(since)
    return _utc_ms(status["ts"])


def _utc_ms(epoch_ms: object) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(str(epoch_ms)) / 1000, dt.UTC)
