"""A settlement is judged by when it reached the commands log
(docs/settlement-by-log.md): one that Kafka appended while its lock held is
final at once, even if the engine reads it only after the lock's end or
after a crash; one appended after the lock's end is refused; and of two
receivers that held one message's lock in turn, only one settles it.

Each test runs its own engine worker (on its own namespace) to kill. They run
on Apache Kafka, whose commands topic stamps records with the broker's
append time; on Tansu every settlement waits for the engine's answer."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
)
from settlement.exceptions import MessageLockLostError
from settlement.management import ServiceBusAdministrationClient
from streams.process import EngineProcess
from tests.helpers import Broker

pytestmark = pytest.mark.needs_broker


@pytest.fixture
def own_engine(broker: Broker, tmp_path: Path
               ) -> Iterator[tuple[EngineProcess, ServiceBusAdministrationClient,
                                   ServiceBusClient]]:
    """An engine worker of its own namespace (to kill), its admin and client."""
    conn = broker.connection_string(f"bylog{uuid.uuid4().hex[:6]}")
    engine = EngineProcess(conn, tmp_path / "engine").start()
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        yield engine, admin, client
    finally:
        client.close()
        admin.close()
        engine.stop()


def _send(client: ServiceBusClient, queue: str, count: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                              for i in range(count)])


def _settled_for_good(admin: ServiceBusAdministrationClient, queue: str) -> None:
    """Nothing active, locked or dead-lettered is left of ``queue`` (waits a little
    for the restarted engine to have read everything)."""
    deadline = time.monotonic() + 30
    while True:
        props = admin.get_queue_runtime_properties(queue)
        counts = (props.active_message_count, props.locked_message_count,
                  props.dead_letter_message_count)
        if counts == (0, 0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert counts == (0, 0, 0)


def _received_then_killed(engine: EngineProcess, admin: ServiceBusAdministrationClient,
                          client: ServiceBusClient, count: int, lock_duration: int
                          ) -> tuple[ServiceBusReceiver, list[ServiceBusReceivedMessage]]:
    """``count`` messages of a new queue "work" received, then the engine
    killed: nothing but Kafka is there to take their settlements."""
    admin.create_queue("work", lock_duration=lock_duration)
    _send(client, "work", count)
    receiver = client.get_queue_receiver("work")
    messages = receiver.receive_messages(count, max_wait_time=10)
    assert len(messages) == count
    engine.kill()
    return receiver, messages


def _only_the_abandoned_comes_back(second: ServiceBusReceiver,
                                   messages: list[ServiceBusReceivedMessage]) -> None:
    """Of ``messages`` (m0 completed, m1 abandoned, m2 deferred), only m1
    comes back, once, and m2 waits deferred; ``second`` settles both."""
    again = second.receive_messages(5, max_wait_time=5)
    assert [(m.message_id, m.delivery_count) for m in again] == [("m1", 1)]
    second.complete_message(again[0])
    (deferred,) = second.receive_deferred_messages([messages[2].sequence_number])
    assert deferred.message_id == "m2"
    second.complete_message(deferred)


def test_a_settlement_appended_within_its_lock_is_final_while_the_engine_is_down(
        own_engine: tuple[EngineProcess, ServiceBusAdministrationClient, ServiceBusClient]
        ) -> None:
    engine, admin, client = own_engine
    receiver, messages = _received_then_killed(engine, admin, client, 3, lock_duration=5)
    started = time.monotonic()
    receiver.complete_message(messages[0])  # returns: nothing but Kafka answers it
    receiver.abandon_message(messages[1])
    receiver.defer_message(messages[2])
    assert time.monotonic() - started < 3.0
    time.sleep(max(0.0, 6.0 - (time.monotonic() - started)))  # past the locks' end
    engine.start()
    # The engine read the settlements at their place in the log, before any
    # lock lapsed: the abandoned one comes back once, the others never.
    second = client.get_queue_receiver("work")
    _only_the_abandoned_comes_back(second, messages)
    _settled_for_good(admin, "work")
    receiver.close()
    second.close()


def test_a_settlement_appended_after_its_lock_ended_is_refused(
        own_engine: tuple[EngineProcess, ServiceBusAdministrationClient, ServiceBusClient]
        ) -> None:
    engine, admin, client = own_engine
    # nothing lapses the lock while the engine is down: the log's time decides
    receiver, (message,) = _received_then_killed(engine, admin, client, 1, lock_duration=2)
    time.sleep(2.5)
    restarting = threading.Thread(target=engine.start)
    restarting.start()
    with pytest.raises(MessageLockLostError):
        receiver.complete_message(message)  # waits for the engine's answer
    restarting.join()
    second = client.get_queue_receiver("work")
    (again,) = second.receive_messages(1, max_wait_time=10)
    assert (again.message_id, again.delivery_count) == ("m0", 1)
    second.complete_message(again)
    _settled_for_good(admin, "work")
    receiver.close()
    second.close()


def test_a_settlement_appended_in_its_locks_last_half_second_is_applied_once_and_answered(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """Too late to be final at its append (the clock step bound), still
    within its lock: the quiet copy is applied, and the same id sent again,
    waited for, gets its answer instead of being applied again (which would
    find the lock gone and raise MessageLockLostError)."""
    queue = make_queue(lock_duration=2)
    _send(client, queue, 2)
    with client.get_queue_receiver(queue) as receiver:
        messages = receiver.receive_messages(2, max_wait_time=10)
        assert len(messages) == 2
        for message in messages:
            assert message.locked_until_utc is not None
            time.sleep(max(0.0, message.locked_until_utc.timestamp() - 0.25 - time.time()))
            receiver.complete_message(message)
    with client.get_queue_receiver(queue) as again:
        assert again.receive_messages(2, max_wait_time=3) == []


def test_two_receivers_never_both_settle_one_message(
        own_engine: tuple[EngineProcess, ServiceBusAdministrationClient, ServiceBusClient]
        ) -> None:
    """The first receiver settles each message around its lock's end (some
    within, some in the last half second the client does not trust, some
    after); the second receives each redelivery and settles it. Every
    message is settled exactly once."""
    _engine, admin, client = own_engine
    total = 24
    admin.create_queue("work", lock_duration=2)
    _send(client, "work", total)
    first = client.get_queue_receiver("work")
    held: list[ServiceBusReceivedMessage] = []
    while len(held) < total:
        held += first.receive_messages(total - len(held), max_wait_time=10)
    succeeded: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def count(message: ServiceBusReceivedMessage) -> None:
        with lock:
            succeeded[message.message_id] = succeeded.get(message.message_id, 0) + 1

    def second_receiver() -> None:
        second = client.get_queue_receiver("work")
        while not stop.is_set():
            for message in second.receive_messages(10, max_wait_time=0.5):
                try:
                    second.complete_message(message)
                    count(message)
                except MessageLockLostError:
                    pass
        second.close()

    def settle_late(message: ServiceBusReceivedMessage, offset_s: float) -> None:
        assert message.locked_until_utc is not None
        time.sleep(max(0.0, message.locked_until_utc.timestamp() + offset_s - time.time()))
        try:
            first.complete_message(message)
            count(message)
        except MessageLockLostError:
            pass

    rng = random.Random(7)
    racer = threading.Thread(target=second_receiver)
    settlers = [threading.Thread(target=settle_late, args=(m, rng.uniform(-0.8, 0.4)))
                for m in held]  # around the lock's end
    for thread in [racer, *settlers]:
        thread.start()
    for thread in settlers:
        thread.join(timeout=30)
    deadline = time.monotonic() + 30
    while len(succeeded) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    racer.join(timeout=30)
    first.close()
    assert succeeded == {f"m{i}": 1 for i in range(total)}
    _settled_for_good(admin, "work")


def test_a_session_settlement_appended_within_the_session_lock_is_final_while_the_engine_is_down(
        own_engine: tuple[EngineProcess, ServiceBusAdministrationClient, ServiceBusClient]
        ) -> None:
    """In a session the message locks are the session's: a settlement Kafka
    appended before the session lock's end is final, and closing the
    receiver (which releases the session) does not wait for the engine
    either; the engine applies both in their order when it is back."""
    engine, admin, client = own_engine
    admin.create_queue("work", requires_session=True, lock_duration=5)
    with client.get_queue_sender("work") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}", session_id="s")
                              for i in range(3)])
    receiver = client.get_queue_receiver("work", session_id="s", max_wait_time=10)
    messages = receiver.receive_messages(3, max_wait_time=10)
    assert [m.message_id for m in messages] == ["m0", "m1", "m2"]
    engine.kill()
    started = time.monotonic()
    receiver.complete_message(messages[0])
    receiver.abandon_message(messages[1])
    receiver.defer_message(messages[2])
    receiver.close()
    assert time.monotonic() - started < 3.0
    time.sleep(max(0.0, 6.0 - (time.monotonic() - started)))  # past the session lock's end
    engine.start()
    with client.get_queue_receiver("work", session_id="s", max_wait_time=10) as second:
        # released before its lock's end: m1 counts its abandon, not a lapse
        _only_the_abandoned_comes_back(second, messages)
    _settled_for_good(admin, "work")
