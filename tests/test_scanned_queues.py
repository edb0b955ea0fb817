"""Queues whose headers the engine reads: duplicate detection, and expiry by
the engine's own timer with no receiver around."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.management import ServiceBusAdministrationClient
from spark.audit import run_audit
from streams.process import EngineProcess
from tests.helpers import Broker, drain_ids, last_state


def test_second_send_of_a_message_id_is_acknowledged_but_never_delivered(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_duplicate_detection=True,
                       duplicate_detection_history_time_window=60)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("1", message_id="a"),
                              ServiceBusMessage("2", message_id="b")])
        sender.send_messages(ServiceBusMessage("again", message_id="a"))  # acknowledged
        sender.send_messages(ServiceBusMessage("3", message_id="c"))
    assert drain_ids(client, queue) == ["a", "b", "c"]
    props = admin.get_queue_runtime_properties(queue)
    assert props.active_message_count == 0


def test_duplicate_history_and_scheduled_messages_survive_an_engine_crash(
        broker: Broker, tmp_path: Path, spark: Any) -> None:
    conn = broker.connection_string(f"dup{uuid.uuid4().hex[:6]}")
    engine = EngineProcess(conn, tmp_path).start()
    try:
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin, \
                ServiceBusClient.from_connection_string(conn) as client:
            admin.create_queue("orders", requires_duplicate_detection=True, lock_duration=5)
            admin.create_queue("reminders", lock_duration=5)
            due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=25)
            with client.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("first", message_id="order-1"))
            with client.get_queue_sender("reminders") as sender:
                sender.schedule_messages(ServiceBusMessage("ping", message_id="ping"), due)
            assert drain_ids(client, "orders") == ["order-1"]
            engine.kill()
            engine.start()
            assert admin.get_queue_runtime_properties("reminders").scheduled_message_count == 1
            with client.get_queue_sender("orders") as sender:
                sender.send_messages([ServiceBusMessage("retry", message_id="order-1"),
                                      ServiceBusMessage("next", message_id="order-2")])
            assert drain_ids(client, "orders", wait=3) == ["order-2"]
            receiver = client.get_queue_receiver("reminders")
            [ping] = receiver.receive_messages(1, max_wait_time=40)
            assert ping.message_id == "ping" and dt.datetime.now(dt.UTC) >= due
            receiver.complete_message(ping)
            receiver.close()
        report = run_audit(spark, conn, ["orders", "reminders"])
        assert report.ok and report.messages == 4, report.summary()
    finally:
        engine.stop()


def test_engine_expires_messages_on_its_own_timer_without_a_receiver(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(default_message_time_to_live=1, dead_lettering_on_message_expiration=True)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("x", message_id="x"),
                              ServiceBusMessage("y", message_id="y",
                                                time_to_live=dt.timedelta(hours=1))])
    # No receiver and no admin call from here on: only the engine acts.
    last = last_state(client, queue, lambda state: state["dead_letter"] == 2)
    assert last.get("dead_letter") == 2 and last.get("active") == 0, last
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    reasons = {m.message_id: m.dead_letter_reason for m in dlq.peek_messages(10)}
    assert reasons == {"x": "TTLExpiredException", "y": "TTLExpiredException"}
