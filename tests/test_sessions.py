"""Sessions against the real broker and engine: order within a session,
exclusive session locks, session state, the null-session dead letter,
listing, and sessions on a subscription. (State across an engine ``kill -9``
is in test_engine_crash.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from settlement import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusSubQueue,
)
from settlement.exceptions import (
    InvalidOperationError,
    MessageSizeExceededError,
    OperationTimeoutError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from settlement.management import ServiceBusAdministrationClient
from streams.states import SESSION_ID_NULL_DESCRIPTION, SESSION_ID_NULL_REASON
from topics import names
from topics.connection import parse_connection_string

#: the lock duration of the lapse test: time enough for four calls under load
LAPSE_S = 5
#: how long a receiver waits for what must come (the engine files each sent
#: message under its session a moment after the send)
WAIT_S = 10


def send(client: ServiceBusClient, queue: str, sessions: dict[str, int]) -> None:
    """``count`` messages per session, interleaved: ``<session>-<index>``."""
    longest = max(sessions.values())
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"{s}-{i}", session_id=s, message_id=f"{s}-{i}")
                              for i in range(longest) for s, n in sessions.items() if i < n])


def bodies(messages: list) -> list[str]:
    return [str(m) for m in messages]


def test_order_within_a_session_holds_under_abandon_and_lock_lapse(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_session=True, lock_duration=LAPSE_S)
    send(client, queue, {"a": 5, "b": 3})
    first = client.get_queue_receiver(queue, session_id="a", max_wait_time=WAIT_S)
    m0 = first.receive_messages(1)
    assert bodies(m0) == ["a-0"] and m0[0].session_id == "a"
    first.abandon_message(m0[0])
    again = first.receive_messages(2)  # the abandoned one first, then the next
    assert bodies(again) == ["a-0", "a-1"]
    assert [m.delivery_count for m in again] == [1, 0]
    first.complete_message(again[0])
    assert first.session.locked_until_utc == again[1].locked_until_utc
    time.sleep(LAPSE_S + 0.5)  # the session lock lapses, and a-1's lock with it
    with pytest.raises(SessionLockLostError):
        first.complete_message(again[1])
    with client.get_queue_receiver(queue, session_id="a", max_wait_time=WAIT_S) as second:
        rest = second.receive_messages(10)
        assert bodies(rest) == ["a-1", "a-2", "a-3", "a-4"]
        assert rest[0].delivery_count == 1
        second.complete_messages(rest)
    first.close()
    with client.get_queue_receiver(queue, session_id="b", max_wait_time=WAIT_S) as other:
        assert bodies(other.receive_messages(10)) == ["b-0", "b-1", "b-2"]


def test_messages_locked_with_their_session_and_never_handed_out_count_no_delivery(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """A session's first messages come locked with it; those the application
    never got go back uncounted when the receiver closes, or before an
    abandoned one (which is handed out first again)."""
    queue = make_queue(requires_session=True, lock_duration=10)
    send(client, queue, {"a": 6})
    with client.get_queue_receiver(queue, session_id="a", max_wait_time=WAIT_S) as first:
        (a0,) = first.receive_messages(1)
        (a1,) = first.receive_messages(1)
        assert bodies([a0, a1]) == ["a-0", "a-1"]
        first.complete_message(a0)
        first.abandon_message(a1)
        again = first.receive_messages(2)
        assert [(str(m), m.delivery_count) for m in again] == [("a-1", 1), ("a-2", 0)]
        first.complete_messages(again)
    with client.get_queue_receiver(queue, session_id="a", max_wait_time=WAIT_S) as second:
        rest = second.receive_messages(10)
        assert [(str(m), m.delivery_count) for m in rest] == [
            ("a-3", 0), ("a-4", 0), ("a-5", 0)]
        second.complete_messages(rest)


def test_a_locked_session_cannot_be_locked_again_and_next_available_skips_it(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_session=True, lock_duration=10)
    send(client, queue, {"x": 2, "y": 2})
    with client.get_queue_receiver(queue, session_id="x", max_wait_time=WAIT_S) as holder:
        assert holder.session.session_id == "x"
        with pytest.raises(SessionCannotBeLockedError):
            with client.get_queue_receiver(queue, session_id="x", max_wait_time=1):
                pass
        with client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                       max_wait_time=WAIT_S) as next_one:
            assert next_one.session.session_id == "y"
            next_one.complete_messages(next_one.receive_messages(10))
        with pytest.raises(OperationTimeoutError):  # x is held, y is empty
            with client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                           max_wait_time=1):
                pass
        holder.receive_messages(1)
    # Closing released x: its unsettled message comes back, counting the delivery.
    with client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                   max_wait_time=WAIT_S) as later:
        assert later.session.session_id == "x"
        messages = later.receive_messages(10)
        assert bodies(messages) == ["x-0", "x-1"] and messages[0].delivery_count == 1


def test_competing_session_receivers_each_get_whole_sessions_in_order(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_session=True, lock_duration=10, partition_count=2)
    sessions = {f"s{i}": 15 for i in range(12)}
    send(client, queue, sessions)
    seen: dict[str, list[tuple[int, str]]] = {}
    lock = threading.Lock()

    def work(index: int) -> None:
        wait = WAIT_S  # the first wait covers the engine filing the sends by session
        while True:
            try:
                receiver = client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                                     max_wait_time=wait)
                receiver.__enter__()
            except OperationTimeoutError:
                return
            wait = 1
            with receiver:
                while batch := receiver.receive_messages(4, max_wait_time=0.5):
                    with lock:
                        seen.setdefault(receiver.session.session_id, []).extend(
                            (index, body) for body in bodies(batch))
                    receiver.complete_messages(batch)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(seen) == set(sessions)
    for session, got in seen.items():
        assert [body for _, body in got] == [f"{session}-{i}" for i in range(15)]
        assert len({worker for worker, _ in got}) == 1  # one receiver had the whole session
    assert len({worker for got in seen.values() for worker, _ in got}) > 1  # in parallel


def test_session_state_and_listing(client: ServiceBusClient,
                                   admin: ServiceBusAdministrationClient,
                                   make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_session=True, lock_duration=10)
    send(client, queue, {"busy": 3})
    with client.get_queue_receiver(queue, session_id="quiet") as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state("halfway")
        assert receiver.session.get_state() == b"halfway"
        with pytest.raises(MessageSizeExceededError, match="over the limit"):
            receiver.session.set_state(b"x" * (256 * 1024 + 1))
    assert sorted(client.list_queue_sessions(queue)) == ["busy", "quiet"]
    with client.get_queue_receiver(queue, session_id="busy") as holder:
        assert bodies(holder.peek_messages(5)) == ["busy-0", "busy-1", "busy-2"]
        holder.receive_messages(1, max_wait_time=5)
        by_id = {s.session_id: s for s in admin.list_queue_sessions_runtime_properties(queue)}
        assert by_id["busy"].active_message_count == 3 and by_id["busy"].is_locked
        assert by_id["quiet"].state_size_in_bytes == 7 and not by_id["quiet"].is_locked
    receiver = client.get_queue_receiver(queue, session_id="quiet")
    receiver.session.set_state(None)  # the session's first use locks it
    receiver.close()
    assert client.list_queue_sessions(queue) == ["busy"]


def test_auto_lock_renewer_keeps_a_session(client: ServiceBusClient,
                                           make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_session=True, lock_duration=4)
    send(client, queue, {"long": 2})
    with AutoLockRenewer() as renewer, client.get_queue_receiver(
            queue, session_id="long", max_wait_time=WAIT_S) as receiver:
        renewer.register(receiver, receiver.session, max_lock_renewal_duration=30)
        messages = receiver.receive_messages(2)
        time.sleep(6)  # one and a half lock durations
        assert all(r.succeeded for r in receiver.complete_messages(messages))
        assert receiver.session.auto_renew_error is None
        with pytest.raises(TypeError, match="renew the session lock"):
            receiver.renew_message_lock(messages[0])


def test_messages_without_a_session_id(client: ServiceBusClient, conn: str,
                                       make_queue: Callable[..., str]) -> None:
    queue = make_queue(requires_session=True)
    with client.get_queue_sender(queue) as sender, pytest.raises(InvalidOperationError,
                                                                match="requires sessions"):
        sender.send_messages(ServiceBusMessage("no session"))
    with pytest.raises(InvalidOperationError, match="requires sessions"):
        client.get_queue_receiver(queue, max_wait_time=1).receive_messages(1)
    settings = parse_connection_string(conn)
    producer = Producer(settings.kafka_config())  # a plain Kafka producer
    producer.produce(names.entity_log(settings.namespace, queue), b"raw")
    producer.flush(10)
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                   max_wait_time=10) as dlq:
        dead = dlq.receive_messages(1)
        assert bodies(dead) == ["raw"]
        assert dead[0].dead_letter_reason == SESSION_ID_NULL_REASON
        assert dead[0].dead_letter_error_description == SESSION_ID_NULL_DESCRIPTION
        dlq.complete_message(dead[0])


def test_sessions_on_a_subscription(client: ServiceBusClient,
                                    admin: ServiceBusAdministrationClient,
                                    queue_name: str) -> None:
    topic = queue_name
    admin.create_topic(topic)
    admin.create_subscription(topic, "ordered", requires_session=True, lock_duration=5)
    with client.get_topic_sender(topic) as sender:
        sender.send_messages([ServiceBusMessage(f"{s}-{i}", session_id=s)
                              for i in range(3) for s in ("p", "q")])
        sender.send_messages(ServiceBusMessage("loose"))  # no session: dead-lettered there
    with client.get_subscription_receiver(topic, "ordered", session_id=NEXT_AVAILABLE_SESSION,
                                          max_wait_time=10) as receiver:
        first = receiver.session.session_id
        assert bodies(receiver.receive_messages(10)) == [f"{first}-{i}" for i in range(3)]
    assert sorted(client.list_subscription_sessions(topic, "ordered")) == ["p", "q"]
    with client.get_subscription_receiver(topic, "ordered",
                                          sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                          max_wait_time=10) as dlq:
        dead = dlq.receive_messages(1)
        assert bodies(dead) == ["loose"] and dead[0].dead_letter_reason == SESSION_ID_NULL_REASON
