"""The audit and replay jobs with real Spark, over workloads driven through
the engine: the audit passes a clean run and catches injected faults; replays
are idempotent."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue, cli
from settlement.dead_letters import REPLAYED_FROM
from tests.helpers import drive_topic_workload, drive_workload, receive_exactly
from topics import names
from topics.connection import parse_connection_string

pytest.importorskip("pyspark")


def drain(client: ServiceBusClient, queue: str, sub: Any = None) -> list[Any]:
    with client.get_queue_receiver(queue, sub_queue=sub) as receiver:
        got = receiver.receive_messages(100, max_wait_time=2)
        receiver.complete_messages(got)
    return got


def test_audit_passes_a_clean_run_and_catches_injected_faults(
        spark: Any, conn: str, client: ServiceBusClient, admin: Any, make_queue: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    from spark.audit import run_audit

    queue = make_queue(partition_count=2)
    got = drive_workload(client, queue, sent=20, complete=10, abandon=4, dead_letter=3,
                         reason="poison", defer=3)
    # Subscriptions too: each is judged over its topic's log from where it began.
    eu, every = drive_topic_workload(client, admin, f"{queue}-topic")
    report = run_audit(spark, conn, [queue, eu, every])
    assert report.ok, report.summary()
    assert report.messages == 20 + 10 + 12 and report.windows == 2 + 1 + 1

    # Faults: a second completion by another command, and a state record
    # whose counts the events do not give.
    settings = parse_connection_string(conn)
    victim = got[0]
    key = f"{queue}#{victim.partition}".encode()
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(names.events(settings.namespace), key=key, value=json.dumps({
        "type": "completed", "entity": queue, "partition": victim.partition,
        "offsets": [victim.offset], "count": 1, "ts": now, "cmd": "injected"}).encode())
    producer.produce(names.state(settings.namespace), key=key, value=json.dumps({
        "entity": queue, "partition": victim.partition, "active": 0, "locked": 0,
        "deferred": 0, "dead_letter": 99, "transfer_dead_letter": 0, "scheduled": 0,
        "start": 0, "next": 0, "hw": 0, "ts": now + 1}).encode())
    producer.flush(10)
    report = run_audit(spark, conn, [queue])
    assert not report.ok
    assert report.findings["double"] == [{"entity": queue, "partition": victim.partition,
                                          "offset": victim.offset, "settled_by_commands": 2}]
    (inconsistent,) = report.findings["inconsistent"]
    assert inconsistent["partition"] == victim.partition
    assert inconsistent["dead_letter"]["state_topic"] == 99
    assert cli.main(["replay", "audit", queue, "--connection-string", conn]) == 1
    assert "double 1" in capsys.readouterr().out


def test_replay_dlq_resubmits_matching_dead_letters_once(
        spark: Any, conn: str, client: ServiceBusClient, make_queue: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    from spark.replay import replay_dlq

    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"id-{i}",
                                                application_properties={"n": i})
                              for i in range(6)])
    with client.get_queue_receiver(queue) as receiver:
        got = receive_exactly(receiver, 6)
        for message in got[:3]:
            receiver.dead_letter_message(message, reason="bad")
        for message in got[3:5]:
            receiver.dead_letter_message(message, reason="other")
        receiver.complete_message(got[5])
    # A run that sent the copy of id-0 and stopped before completing its dead letter:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(
            "m0", message_id="id-0", application_properties={
                "n": 0, REPLAYED_FROM: f"{queue}/{got[0].partition}/{got[0].offset}"}))

    assert replay_dlq(spark, client, conn, queue, reason="bad") == 3
    args = ["replay", "dlq", queue, "--reason", "bad", "--connection-string", conn]
    assert cli.main(args) == 0  # a second run resubmits nothing more
    assert f"resubmitted 0 dead letter(s) of {queue!r}" in capsys.readouterr().out
    copies = drain(client, queue)
    assert sorted(m.message_id for m in copies) == ["id-0", "id-1", "id-2"]
    assert all(m.application_properties[REPLAYED_FROM].startswith(f"{queue}/")
               for m in copies)
    assert sorted(str(m) for m in copies) == ["m0", "m1", "m2"]
    left = drain(client, queue, ServiceBusSubQueue.DEAD_LETTER)
    assert sorted(m.dead_letter_reason for m in left) == ["other", "other"]

    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert replay_dlq(spark, client, conn, queue, since=future) == 0


def test_replay_range_republishes_a_time_range_once(
        spark: Any, conn: str, client: ServiceBusClient, admin: Any, make_queue: Any) -> None:
    from spark.replay import replay_range

    source = make_queue()
    target = admin.create_queue(f"{source}-copy").name
    with client.get_queue_sender(source) as sender:
        sender.send_messages([ServiceBusMessage(f"early{i}") for i in range(3)])
        time.sleep(0.05)
        since = dt.datetime.now(dt.UTC)
        sender.send_messages([ServiceBusMessage(f"late{i}", subject="s",
                                                application_properties={"i": i})
                              for i in range(4)])
    assert replay_range(spark, client, conn, source, target, since=since) == 4
    assert replay_range(spark, client, conn, source, target, since=since) == 0
    copies = drain(client, target)
    assert sorted(str(m) for m in copies) == [f"late{i}" for i in range(4)]
    assert all(m.subject == "s" for m in copies)
    with pytest.raises(ValueError, match="different target"):
        replay_range(spark, client, conn, source, source, since=since)
