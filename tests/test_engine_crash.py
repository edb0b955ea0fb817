"""kill -9 of the engine in the middle of a stream loses and doubles nothing,
as the clients see it and as the Spark audit of the engine's records sees it;
session state and the order of a session's messages survive it.

This test runs its own engine worker on its own namespace, so killing it does
not disturb the session's engine.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from settlement import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from settlement.exceptions import MessageLockLostError, ServiceBusError
from settlement.management import ServiceBusAdministrationClient
from spark.audit import run_audit
from streams.process import EngineProcess
from tests.helpers import TEST_BROKER, Broker

#: Core settlement: in the compatibility subset that also runs on Tansu.
pytestmark = pytest.mark.tansu

TOTAL = 400


def test_kill_9_mid_stream_then_restart_loses_nothing_and_completes_nothing_twice(
        broker: Broker, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    conn = broker.connection_string(f"crash{uuid.uuid4().hex[:6]}")
    engine = EngineProcess(conn, tmp_path).start()
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        admin.create_queue("work", lock_duration=4, max_delivery_count=50)
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                  for i in range(TOTAL)])
        _start_a_session(admin, client)
        holder = client.get_queue_receiver("work")
        held = holder.receive_messages(5, max_wait_time=10)  # locks held across the crash
        assert held

        completed: dict[str, int] = {}
        errors: list[Exception] = []
        stop = threading.Event()

        def consume() -> None:
            receiver = client.get_queue_receiver("work")
            while not stop.is_set() and len(completed) < TOTAL:
                try:
                    batch = receiver.receive_messages(20, max_wait_time=1)
                    for result in receiver.complete_messages(batch):
                        if result.succeeded:
                            mid = result.message.message_id
                            completed[mid] = completed.get(mid, 0) + 1
                except ServiceBusError as exc:  # the engine is down for a while
                    errors.append(exc)
                    time.sleep(0.2)

        worker = threading.Thread(target=consume)
        worker.start()
        deadline = time.monotonic() + 60
        while len(completed) < TOTAL // 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.kill()
        killed_at = len(completed)
        assert killed_at < TOTAL, "the stream finished before the crash"
        time.sleep(1)
        engine.start()
        for message in held:  # either still valid, or lost and redelivered
            try:
                holder.complete_message(message)
                completed[message.message_id] = completed.get(message.message_id, 0) + 1
            except MessageLockLostError:
                pass
        worker.join(timeout=180)
        stop.set()
        _resume_the_session(client)
        assert set(completed) == {f"m{i}" for i in range(TOTAL)}, (
            f"missing {sorted(set(f'm{i}' for i in range(TOTAL)) - set(completed))[:10]}")
        doubled = {m: c for m, c in completed.items() if c > 1}
        assert not doubled, f"completed twice: {doubled}"
        props = admin.get_queue_runtime_properties("work")
        assert props.active_message_count == 0 and props.dead_letter_message_count == 0
        audit_agrees(request, conn, TOTAL)
    finally:
        client.close()
        admin.close()
        engine.stop()


def audit_agrees(request: pytest.FixtureRequest, conn: str, total: int) -> None:
    """The engine's own record agrees: every message's events, the raw log and
    the state topic tell the same story across the crash. Checked on Apache
    Kafka, where the Spark jobs run (Spark's connector cannot read Tansu's log
    ends: the README's compatibility table)."""
    if TEST_BROKER != "kafka":
        return
    report = run_audit(request.getfixturevalue("spark"), conn, ["work"])
    assert report.ok and report.messages == total, report.summary()


def _start_a_session(admin: ServiceBusAdministrationClient, client: ServiceBusClient) -> None:
    """Half of a session done, its progress in the session state."""
    admin.create_queue("steps", requires_session=True, lock_duration=4)
    with client.get_queue_sender("steps") as sender:
        sender.send_messages([ServiceBusMessage(f"step {i}", session_id="job-1")
                              for i in range(4)])
    with client.get_queue_receiver("steps", session_id="job-1", max_wait_time=10) as receiver:
        done = receiver.receive_messages(2)
        receiver.complete_messages(done)
        receiver.session.set_state(b"2 of 4 steps done")


def _resume_the_session(client: ServiceBusClient) -> None:
    """After the crash, the next receiver finds the state and the rest, in order."""
    with client.get_queue_receiver("steps", session_id=NEXT_AVAILABLE_SESSION,
                                   max_wait_time=30) as receiver:
        assert receiver.session.get_state() == b"2 of 4 steps done"
        rest = receiver.receive_messages(10)
        assert [b"".join(m.body) for m in rest] == [b"step 2", b"step 3"]
        receiver.complete_messages(rest)


def test_a_crash_right_after_the_commit_record_keeps_state_and_events_together(
        broker: Broker, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The worker dies once a settlement's commit record is acknowledged and
    before its writes and events are sent. The restarted worker applies the
    record's redo and publishes its outbox: the retried settlement is answered
    from memory, and the events and the state agree."""
    conn = broker.connection_string(f"commit{uuid.uuid4().hex[:6]}")
    engine = EngineProcess(conn, tmp_path, env={"SETTLEMENT_FAULT_EXIT_AFTER_COMMIT": "settle"})
    engine.start()
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        admin.create_queue("work", lock_duration=60)
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                  for i in range(20)])
        receiver = client.get_queue_receiver("work")
        messages = receiver.receive_messages(20, max_wait_time=10)
        assert len(messages) == 20

        def restart_when_dead() -> None:
            assert engine.proc is not None
            engine.proc.wait(60)
            engine.env.clear()
            engine.start()

        restarter = threading.Thread(target=restart_when_dead)
        restarter.start()
        results = receiver.complete_messages(messages)  # retried until the new worker answers
        restarter.join(90)
        assert "exiting after the commit record of settle" in engine.log_path.read_text()
        assert all(r.succeeded for r in results), [str(r.error) for r in results if r.error]
        props = admin.get_queue_runtime_properties("work")
        assert (props.active_message_count, props.locked_message_count) == (0, 0)
        audit_agrees(request, conn, 20)
    finally:
        client.close()
        admin.close()
        engine.stop()
