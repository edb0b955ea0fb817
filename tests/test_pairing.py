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
import threading
import time
from collections.abc import Iterator

import pytest

from settlement import (
    SendAvailabilityPairedNamespaceOptions,
    ServiceBusClient,
    ServiceBusMessage,
)
from settlement.apache_kafka import KafkaCluster
from settlement.management import ServiceBusAdministrationClient
from settlement.pairing import backlog_queue_names, read_status
from tests.helpers import TEST_BROKER
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


@pytest.mark.skipif(TEST_BROKER != "kafka", reason="a killed embedded broker (Tansu) comes "
                    "back empty: it keeps its log in memory")
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
