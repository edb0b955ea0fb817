"""A commit record Kafka does not take stops the engine worker, its commands'
offsets uncommitted: a worker that takes the partition over, with none of
the first one's local tables, applies them again from the commands topic,
and a settlement that was final at its append stays applied.

Kafka is made to refuse the windows' commit records by lowering the
``max.message.bytes`` of the headers' changelog topic under a running
worker. This test runs its own engine worker on its own namespace."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from settlement.management import ServiceBusAdministrationClient
from settlement.receiver import ServiceBusReceiver
from streams.engine_worker import COMMIT_REFUSED_EXIT
from streams.process import EngineProcess
from tests.helpers import Broker
from topics import names
from topics.connection import parse_connection_string

pytestmark = pytest.mark.needs_broker
LOCK_S = 5


def _max_message_bytes(admin: AdminClient, topic: str, value: str | None) -> None:
    """Set the topic's ``max.message.bytes`` (None: back to the broker's default)."""
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", value or "", incremental_operation=op)])
    admin.incremental_alter_configs([resource])[resource].result(10)


def _receive_all(receiver: ServiceBusReceiver, want: int, within: float
                 ) -> dict[str, ServiceBusReceivedMessage]:
    """Message id -> the message, until ``want`` ids came or ``within`` s
    passed (a lock that lapses meanwhile brings its message again)."""
    got: dict[str, ServiceBusReceivedMessage] = {}
    deadline = time.monotonic() + within
    while len(got) < want and time.monotonic() < deadline:
        for message in receiver.receive_messages(want, max_wait_time=2):
            assert message.message_id is not None
            got[message.message_id] = message
    return got


def test_a_refused_commit_record_stops_the_worker_and_loses_no_settlement(
        broker: Broker, tmp_path: Path) -> None:
    conn = broker.connection_string(f"refused{uuid.uuid4().hex[:6]}")
    headers = names.table_changelog(parse_connection_string(conn).namespace, "headers")
    first = EngineProcess(conn, tmp_path / "first").start()
    taker = EngineProcess(conn, tmp_path / "taker")  # none of the first one's tables
    kafka_admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        admin.create_queue("work", lock_duration=LOCK_S)
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                  for i in range(3)])
        receiver = client.get_queue_receiver("work")
        held = _receive_all(receiver, 3, 20)
        assert sorted(held) == ["m0", "m1", "m2"]
        done = held["m0"]

        _max_message_bytes(kafka_admin, headers, "64")  # every commit record is larger
        time.sleep(1)  # the broker applies a topic's new config within moments
        # Final once Kafka appended it, its lock far from its end: the client
        # returns without the engine's answer (docs/settlement-by-log.md).
        receiver.complete_message(done)

        assert first.proc is not None
        assert first.proc.wait(60) == COMMIT_REFUSED_EXIT, first.log_tail()
        log = first.log_path.read_text(errors="replace")
        assert "Kafka did not take the commit record of" in log
        assert "start it again" in log

        _max_message_bytes(kafka_admin, headers, None)
        taker.start()
        # m1 and m2 come back once their locks lapse; the completed m0 never does.
        again = _receive_all(client.get_queue_receiver("work"), 3, LOCK_S + 25)
        assert sorted(again) == ["m1", "m2"]
        props = admin.get_queue_runtime_properties("work")
        assert props.total_message_count == 2, props
    finally:
        client.close()
        admin.close()
        if first.proc is not None and first.proc.poll() is None:
            first.stop()
        if taker.proc is not None:
            taker.stop()
