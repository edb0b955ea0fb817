"""Paired namespaces for send availability, on two real clusters of the
session's kind: a primary started here (so it can be paused) with its own
engine, and the session's broker as the secondary.

The primary is paused (SIGSTOP) while a sender sends 10,000 messages: the
sender carries on into the backlog, and once the primary is back a syphon
moves the backlog there; every message is received once, from the primary.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from settlement import (
    SendAvailabilityPairedNamespaceOptions,
    ServiceBusClient,
    ServiceBusMessage,
)
from settlement.management import ServiceBusAdministrationClient
from settlement.pairing import backlog_queue_names, read_status
from settlement.testing.apache_kafka import KafkaCluster
from spark.dashboard import dump_dom
from tests.helpers import run_monitor
from tests.pairing_helpers import Primary, running_primary
from topics.connection import parse_connection_string

TOTAL = 10_000
BATCH = 50
PAUSE_S = 6.0
FAILOVER = dt.timedelta(seconds=2)
SPACING_S = 0.06


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Primary]:
    with running_primary(tmp_path_factory.mktemp("primary-engine")) as started:
        yield started


def _send_all(client: ServiceBusClient, queue: str, pauses: list[float],
              primary: Primary, errors: list[BaseException]) -> None:
    """Send TOTAL messages in batches; pause the primary for PAUSE_S s after
    a third of them; record how long each batch took."""
    try:
        with client.get_queue_sender(queue) as sender:
            for first in range(0, TOTAL, BATCH):
                if first == TOTAL // 3 // BATCH * BATCH:
                    primary.pause()
                    threading.Timer(PAUSE_S, primary.resume).start()
                started = time.monotonic()
                sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                      for i in range(first, first + BATCH)])
                pauses.append(time.monotonic() - started)
                time.sleep(SPACING_S)  # so the sending outlasts the pause
    except BaseException as exc:  # reported by the test
        logging.getLogger(__name__).exception("the sender failed")
        errors.append(exc)


def test_sends_carry_on_while_the_primary_is_paused_and_the_syphon_moves_them_back(
        primary: Primary, conn: str, queue_name: str) -> None:
    with ServiceBusAdministrationClient.from_connection_string(primary.conn) as admin:
        admin.create_queue(queue_name)
    sending = SendAvailabilityPairedNamespaceOptions(conn, backlog_queue_count=3,
                                                     failover_interval=FAILOVER)
    with ServiceBusClient.from_connection_string(primary.conn,
                                                 paired_namespace=sending) as client:
        assert sending.backlog_queue_count == 3
        assert sending.backlog_queues_found + sending.backlog_queues_created == 3
        pauses: list[float] = []
        errors: list[BaseException] = []
        _send_all(client, queue_name, pauses, primary, errors)
        assert not errors, errors
        route = client._pairing.route("queue", queue_name)  # noqa: SLF001 - what it did
        assert route.failovers >= 1 and route.sent_to_backlog > 0, route
        # the probe saw the primary back, and the rest went there
        assert not route.to_backlog and route.sent_to_backlog < TOTAL - TOTAL // 3, route
    # the sender carried on: no batch waited much longer than the failover interval
    assert len(pauses) == TOTAL // BATCH
    assert max(pauses) < FAILOVER.total_seconds() + 5, max(pauses)
    secondary = parse_connection_string(conn)
    statuses = [s for s in read_status(secondary, parse_connection_string(
        primary.conn).namespace) if s["entity"] == queue_name]
    assert any(s["failovers"] for s in statuses), statuses

    receiving = SendAvailabilityPairedNamespaceOptions(conn, backlog_queue_count=3,
                                                       enable_syphon=True)
    seen: dict[str, int] = {}
    with ServiceBusClient.from_connection_string(primary.conn,
                                                 paired_namespace=receiving) as client:
        assert receiving.backlog_queues_found == 3 and receiving.backlog_queues_created == 0
        deadline = time.monotonic() + 120
        with client.get_queue_receiver(queue_name) as receiver:
            while len(seen) < TOTAL and time.monotonic() < deadline:
                batch = receiver.receive_messages(500, max_wait_time=2)
                for message in batch:
                    seen[str(message.message_id)] = seen.get(str(message.message_id), 0) + 1
                receiver.complete_messages(batch)
            syphon = client._pairing._syphon  # noqa: SLF001 - what it did
            # whatever else arrives now would be a second copy
            for message in receiver.receive_messages(500, max_wait_time=3):
                seen[str(message.message_id)] = seen.get(str(message.message_id), 0) + 1
    assert len(seen) == TOTAL, f"{TOTAL - len(seen)} messages never arrived"
    assert syphon is not None and syphon.moved + syphon.skipped == route.sent_to_backlog
    assert not [m for m, n in seen.items() if n > 1], "received more than once"
    with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
        left = sum(admin.get_queue_runtime_properties(q).active_message_count
                   for q in backlog_queue_names(parse_connection_string(primary.conn).namespace,
                                                3))
    assert left == 0


def test_a_killed_primary_comes_back_and_a_receive_loop_outlives_it(
        primary: Primary, conn: str, queue_name: str) -> None:
    """kill -9 of the primary's node while a sender sends TOTAL messages and
    a receive loop of a syphon client runs: the loop carries on once the
    node restarts on its data, and receives each message once."""
    assert isinstance(primary.broker, KafkaCluster)
    node = primary.broker.nodes[0].node_id
    with ServiceBusAdministrationClient.from_connection_string(primary.conn) as admin:
        admin.create_queue(queue_name)
    seen: dict[str, int] = {}
    loop_errors: list[BaseException] = []
    stop = threading.Event()

    def receive_loop(client: ServiceBusClient) -> None:
        try:
            with client.get_queue_receiver(queue_name) as receiver:
                while not stop.is_set():
                    batch = receiver.receive_messages(500, max_wait_time=1)
                    for message in batch:
                        seen[str(message.message_id)] = seen.get(str(message.message_id), 0) + 1
                    receiver.complete_messages(batch)
        except BaseException as exc:  # reported by the test
            logging.getLogger(__name__).exception("the receive loop failed")
            loop_errors.append(exc)

    receiving = SendAvailabilityPairedNamespaceOptions(conn, backlog_queue_count=3,
                                                       enable_syphon=True)
    sending = SendAvailabilityPairedNamespaceOptions(conn, backlog_queue_count=3,
                                                     failover_interval=FAILOVER)
    with ServiceBusClient.from_connection_string(primary.conn,
                                                 paired_namespace=receiving) as receiver_client, \
            ServiceBusClient.from_connection_string(primary.conn,
                                                    paired_namespace=sending) as sender_client:
        loop = threading.Thread(target=receive_loop, args=(receiver_client,))
        loop.start()
        try:
            with sender_client.get_queue_sender(queue_name) as sender:
                for first in range(0, TOTAL, BATCH):
                    if first == TOTAL // 3 // BATCH * BATCH:
                        primary.broker.kill_node(node)
                        threading.Timer(PAUSE_S, primary.broker.start_node, (node, False)).start()
                    sender.send_messages([ServiceBusMessage(f"k{i}", message_id=f"k{i}")
                                          for i in range(first, first + BATCH)])
                    time.sleep(SPACING_S)
            route = sender_client._pairing.route("queue", queue_name)  # noqa: SLF001
            assert route.failovers >= 1 and route.sent_to_backlog > 0, route
            deadline = time.monotonic() + 180
            while len(seen) < TOTAL and time.monotonic() < deadline and loop.is_alive():
                time.sleep(1)
            time.sleep(3)  # a second copy would arrive now
        finally:
            stop.set()
            loop.join(timeout=60)
    assert not loop_errors, loop_errors
    assert len(seen) == TOTAL, f"{TOTAL - len(seen)} messages never arrived"
    assert not [m for m, n in seen.items() if n > 1], "received more than once"


def test_the_secondarys_dashboard_shows_failovers_and_backlog_depth(
        primary: Primary, conn: str, queue_name: str, spark: Any, browser: None,
        dashboard_url: tuple[str, Path]) -> None:
    """A monitor on the secondary and its dashboard, in headless Chromium:
    while the primary is paused, the entity's failover, its client sending
    to the backlog and the messages waiting there; once the syphon has moved
    them, the switch back and an empty backlog."""
    url, sink = dashboard_url
    primary_ns = parse_connection_string(primary.conn).namespace
    entity = f"{primary_ns}/{queue_name}"
    with ServiceBusAdministrationClient.from_connection_string(primary.conn) as admin:
        admin.create_queue(queue_name)
    sending = SendAvailabilityPairedNamespaceOptions(conn, backlog_queue_count=3,
                                                     failover_interval=FAILOVER)
    with ServiceBusClient.from_connection_string(primary.conn,
                                                 paired_namespace=sending) as client, \
            client.get_queue_sender(queue_name) as sender:
        sender.send_messages(ServiceBusMessage("before", message_id="before"))
        primary.pause()
        try:
            for first in range(0, 300, 100):
                sender.send_messages([ServiceBusMessage(f"d{i}", message_id=f"d{i}")
                                      for i in range(first, first + 100)])
            route = client._pairing.route("queue", queue_name)  # noqa: SLF001 - what it did
            assert route.to_backlog and route.sent_to_backlog == 300, route
            # a client in the backlog reports its progress every few seconds
            progress = _wait_for_status(conn, primary_ns, queue_name,
                                        lambda s: s["sent_to_backlog"] == 300)
            assert (progress["mode"], progress["failovers"]) == ("backlog", 1), progress
            waiting = _backlog_depth(conn, primary_ns)
            assert waiting >= 300
            run_monitor(spark, conn, sink)
            paired, backlog = _dashboard_rows(url, entity, primary_ns)
            assert paired == {"failovers": "1", "switch_backs": "0",
                              "sending_to_backlog": "1", "sent_to_backlog": "300"}, paired
            assert backlog == {"queues": "3", "waiting": str(waiting)}, backlog
        finally:
            primary.resume()
        deadline = time.monotonic() + 60
        while route.to_backlog and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not route.to_backlog, "the probe never saw the primary back"

    receiving = SendAvailabilityPairedNamespaceOptions(conn, backlog_queue_count=3,
                                                       enable_syphon=True)
    seen: list[str] = []
    with ServiceBusClient.from_connection_string(primary.conn,
                                                 paired_namespace=receiving) as client, \
            client.get_queue_receiver(queue_name) as receiver:
        deadline = time.monotonic() + 120
        while len(seen) < 301 and time.monotonic() < deadline:
            batch = receiver.receive_messages(500, max_wait_time=2)
            seen += [str(m.message_id) for m in batch]
            receiver.complete_messages(batch)
        while _backlog_depth(conn, primary_ns) and time.monotonic() < deadline:
            time.sleep(0.5)  # the syphon completes its copies after moving them
    assert sorted(seen) == sorted(["before", *(f"d{i}" for i in range(300))])
    assert _backlog_depth(conn, primary_ns) == 0
    run_monitor(spark, conn, sink)
    paired, backlog = _dashboard_rows(url, entity, primary_ns)
    assert paired == {"failovers": "1", "switch_backs": "1",
                      "sending_to_backlog": "0", "sent_to_backlog": "300"}, paired
    assert backlog == {"queues": "3", "waiting": "0"}, backlog
    dom = dump_dom(url)
    assert "Backlog queues: messages waiting (end of window)" in dom
    assert "Failovers to this namespace per window" in dom


def _wait_for_status(conn: str, primary_ns: str, queue: str,
                     done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        mine = [s for s in read_status(parse_connection_string(conn), primary_ns)
                if s["entity"] == queue]
        if mine and done(mine[-1]) or time.monotonic() > deadline:
            assert mine, f"no status record of {queue}"
            return mine[-1]
        time.sleep(1)


def _backlog_depth(conn: str, primary_ns: str) -> int:
    with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
        return sum(admin.get_queue_runtime_properties(q).active_message_count
                   for q in backlog_queue_names(primary_ns, 3))


def _dashboard_rows(url: str, entity: str, primary_ns: str
                    ) -> tuple[dict[str, str], dict[str, str]]:
    """The cells of the entity's row and of its primary's backlog row, as
    headless Chromium shows the page."""
    dom = dump_dom(url)
    rows = []
    for attribute, key in (("data-paired", entity), ("data-backlog", primary_ns)):
        row = re.search(rf'<tr {attribute}="{re.escape(key)}">(.*?)</tr>', dom)
        assert row, f"no {attribute} row for {key} on the page"
        rows.append(dict(re.findall(r'data-metric="(\w+)">([^<]*)<', row.group(1))))
    rows[0].pop("last_report")
    return rows[0], rows[1]
