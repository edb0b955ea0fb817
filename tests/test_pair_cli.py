"""``settlement pair status`` on two real clusters of the session's kind: a
primary started here (so it can be paused) with its own engine, and the
session's broker as the secondary.

While the primary is paused, a paired sender fails over to the backlog, and
the command, which reads the secondary only, shows the queue sending there
and the messages waiting; once the primary is back, the queue sends to it
again, and the backlog still holds what no syphon moved.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Iterator

import pytest

from settlement import (
    SendAvailabilityPairedNamespaceOptions,
    ServiceBusClient,
    ServiceBusMessage,
)
from settlement.cli import main
from settlement.management import ServiceBusAdministrationClient
from tests.pairing_helpers import Primary, running_primary

#: how long sends fail before the queue fails over. The first send, before the
#: pause, must stay within it: a new producer's first delivery (metadata, its
#: idempotence id) took over a second on the two busy test workers of a CI
#: run (2026-11-29), failed those 10 messages over too, and the test saw
#: two failovers and 40 messages in the backlog instead of one and 30.
FAILOVER = dt.timedelta(seconds=4)
BACKLOG_QUEUES = 2
BATCH = 10
#: batches sent while the primary is paused (the first fails over)
PAUSED_BATCHES = 3
#: a table printed by the command: its rows as {header: cell}
Table = list[dict[str, str]]


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Primary]:
    with running_primary(tmp_path_factory.mktemp("primary-engine")) as started:
        yield started


def tables(out: str) -> dict[str, Table]:
    """The tables of ``out`` by their first header; cells are separated by
    two spaces or more (a time has one)."""
    found: dict[str, Table] = {}
    lines = out.splitlines()
    for at, line in enumerate(lines[1:], start=1):
        if not re.fullmatch(r"-+( +-+)*", line):
            continue
        headers = re.split(r" {2,}", lines[at - 1].strip())
        rows = []
        for row in lines[at + 1:]:
            if not row.strip():
                break
            rows.append(dict(zip(headers, re.split(r" {2,}", row.strip()), strict=True)))
        found[headers[0]] = rows
    return found


def pair_status(capsys: pytest.CaptureFixture[str], primary: Primary, secondary: str,
                *extra: str) -> tuple[str, dict[str, Table]]:
    capsys.readouterr()  # drop what came before
    code = main(["pair", "status", "--connection-string", primary.conn,
                 "--secondary", secondary, *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, tables(out)


def until(check: Callable[[], tuple[str, dict[str, Table]]],
          done: Callable[[dict[str, Table]], bool], timeout: float = 15.0
          ) -> tuple[str, dict[str, Table]]:
    """Run ``check`` until ``done`` holds for its tables (status records are
    published without holding up the sends that cause them)."""
    deadline = time.monotonic() + timeout
    out, found = check()
    while not done(found) and time.monotonic() < deadline:
        time.sleep(0.5)
        out, found = check()
    assert done(found), out
    return out, found


def _mode(queue: str, mode: str) -> Callable[[dict[str, Table]], bool]:
    return lambda found: [r["SENDS TO"] for r in found.get("KIND", [])
                          if r["ENTITY"] == queue] == [mode]


def _backlog_of(queue: str, waiting: int) -> Callable[[dict[str, Table]], bool]:
    """The queue sends to the backlog, which holds ``waiting`` messages (the
    status records are published without holding up the sends). Two CI runs
    (2026-11-30, 12-01) saw 20 of the 30: the client's own count said 20 too.
    ``kill`` had returned before the JVM's threads stopped, and the loaded
    primary acknowledged the first batch sent "while paused";
    :meth:`Primary.pause` now waits until every thread has stopped."""
    in_backlog = _mode(queue, "backlog")
    return lambda found: in_backlog(found) and [
        r["ACTIVE MESSAGES"] for r in found.get("QUEUE", []) if r["QUEUE"] == "total"
    ] == [str(waiting)]


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["pair"], ["pair", "status"]):
        assert main([*command, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: settlement {' '.join(command)}")


def test_status_while_the_primary_is_paused_and_after(
        primary: Primary, conn: str, queue_name: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with ServiceBusAdministrationClient.from_connection_string(primary.conn) as admin:
        admin.create_queue(queue_name)
    options = SendAvailabilityPairedNamespaceOptions(
        conn, backlog_queue_count=BACKLOG_QUEUES, failover_interval=FAILOVER)
    backlog = PAUSED_BATCHES * BATCH
    with ServiceBusClient.from_connection_string(primary.conn,
                                                 paired_namespace=options) as client, \
            client.get_queue_sender(queue_name) as sender:
        sender.send_messages([ServiceBusMessage("before") for _ in range(BATCH)])
        primary.pause()
        try:
            for _ in range(PAUSED_BATCHES):
                sender.send_messages([ServiceBusMessage("paused") for _ in range(BATCH)])
            # what the client did, before what the command shows of it
            assert client._pairing is not None  # noqa: SLF001 - what it did
            route = client._pairing.route("queue", queue_name)  # noqa: SLF001
            assert (route.failovers, route.sent_to_backlog) == (1, backlog)
            # the command reads only the secondary: it answers while the primary is away
            out, found = until(lambda: pair_status(capsys, primary, conn),
                               _backlog_of(queue_name, backlog))
        finally:
            primary.resume()
        row = next(r for r in found["KIND"] if r["ENTITY"] == queue_name)
        assert (row["KIND"], row["FAILOVERS"]) == ("queue", "1"), out
        assert dt.datetime.strptime(row["SINCE (UTC)"], "%Y-%m-%d %H:%M:%S")
        depths = {r["QUEUE"]: r["ACTIVE MESSAGES"] for r in found["QUEUE"]}
        assert len(depths) == BACKLOG_QUEUES + 1, out  # the queues found, and the total
        assert depths.pop("total") == str(backlog), out

        # back: the probe sees the primary and the queue sends there again
        out, found = until(lambda: pair_status(capsys, primary, conn, "--backlog-queue-count",
                                               str(BACKLOG_QUEUES + 1)),
                           _mode(queue_name, "primary"))
        row = next(r for r in found["KIND"] if r["ENTITY"] == queue_name)
        assert (row["FAILOVERS"], row["SENT TO BACKLOG"]) == ("1", str(backlog)), out
        depths = {r["QUEUE"]: r["ACTIVE MESSAGES"] for r in found["QUEUE"]}
        assert list(depths.values())[-2:] == ["not created", str(backlog)], out
