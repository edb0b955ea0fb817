"""What a received message says, as the azure-servicebus SDK says it: sequence
numbers from 1, delivery_count as earlier deliveries, bodies as sections, the
lock renewer's callback only on a lost lock, and keywords refused by name."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest

from settlement import (
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from settlement.amqp import AmqpMessageBodyType
from settlement.exceptions import AutoLockRenewTimeout, MessageLockLostError
from settlement.management import ServiceBusAdministrationClient


def send(client: ServiceBusClient, queue: str, *ids: str) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"body-{i}", message_id=i) for i in ids])


def test_sequence_numbers_start_at_1_everywhere_they_are_shown_or_taken(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)
    send(client, queue, "a", "b", "c")
    receiver = client.get_queue_receiver(queue, max_wait_time=10)
    assert [m.sequence_number for m in receiver.peek_messages(3)] == [1, 2, 3]
    assert [m.message_id for m in receiver.peek_messages(2, sequence_number=2)] == ["b", "c"]
    got = receiver.receive_messages(3)
    while len(got) < 3:
        got += receiver.receive_messages(3 - len(got))
    assert [(m.message_id, m.sequence_number) for m in got] == [("a", 1), ("b", 2), ("c", 3)]
    # The SDK's deferral sample: a truthy check must not strand the first message.
    for message in got[:2]:
        receiver.defer_message(message)
    deferred = [m.sequence_number for m in got[:2] if m.sequence_number]
    assert [m.message_id for m in receiver.receive_deferred_messages(deferred)] == ["a", "b"]
    receiver.dead_letter_message(got[2], reason="r")
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                    max_wait_time=10)
    [dead] = dlq.receive_messages(1)
    assert (dead.message_id, dead.sequence_number) == ("c", 3)

    with client.get_queue_sender(queue) as sender:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        [scheduled] = sender.schedule_messages(ServiceBusMessage("later"), later)
        assert scheduled == 4
        sender.cancel_scheduled_messages(scheduled)


def test_delivery_count_counts_earlier_deliveries_and_max_delivery_still_holds(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, max_delivery_count=3)
    send(client, queue, "poison")
    receiver = client.get_queue_receiver(queue, max_wait_time=10)
    assert receiver.peek_messages(1)[0].delivery_count == 0
    counts = []
    for _ in range(3):  # max_delivery_count=3: delivered three times
        [message] = receiver.receive_messages(1)
        counts.append(message.delivery_count)
        receiver.abandon_message(message)
    assert counts == [0, 1, 2]
    assert receiver.receive_messages(1, max_wait_time=1) == []
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                    max_wait_time=10)
    [dead] = dlq.peek_messages(1)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description == (
        "message was delivered 3 times (max_delivery_count 3) without being settled")


def test_body_is_an_iterable_of_data_sections_and_str_is_the_text(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    outgoing = ServiceBusMessage("héllo", application_properties={"Color": "Red", "n": 3})
    assert next(outgoing.body) == "héllo".encode()
    assert outgoing.body_type == AmqpMessageBodyType.DATA
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([outgoing, ServiceBusMessage(b"\x00\xff")])
    receiver = client.get_queue_receiver(queue, max_wait_time=10)
    got = receiver.receive_messages(2)
    while len(got) < 2:
        got += receiver.receive_messages(2 - len(got))
    text, raw = sorted(got, key=lambda m: m.sequence_number)
    assert next(text.body) == "héllo".encode()  # the SDK's dead-letter sample does this
    assert b"".join(text.body) == "héllo".encode() and str(text) == "héllo"
    assert list(raw.body) == [b"\x00\xff"] and raw.body_type == AmqpMessageBodyType.DATA
    # looked up by bytes, as SDK code does, strings come back as bytes
    props = text.application_properties
    assert (props["Color"], props.get(b"Color"), props[b"n"], b"n" in props) == (
        "Red", b"Red", 3, True)
    assert props.get(b"missing") is None and dict(props) == {"Color": "Red", "n": 3}
    receiver.complete_messages(got)


def locked_message(client: ServiceBusClient, queue: str
                   ) -> tuple[ServiceBusReceiver, ServiceBusReceivedMessage]:
    send(client, queue, "locked")
    receiver = client.get_queue_receiver(queue, max_wait_time=10)
    [message] = receiver.receive_messages(1)
    return receiver, message


def test_lock_renewer_stops_at_max_duration_without_calling_back_while_the_lock_is_valid(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    failures: list[tuple[object, Exception | None]] = []
    with AutoLockRenewer(max_lock_renewal_duration=3,
                         on_lock_renew_failure=lambda r, e: failures.append((r, e))) as renewer:
        receiver, message = locked_message(client, make_queue(lock_duration=2))
        renewer.register(receiver, message)
        time.sleep(3.5)  # renewed past its first 2 s lock, then renewing stopped
        assert isinstance(message.auto_renew_error, AutoLockRenewTimeout)
        assert message.locked_until_utc is not None
        assert message.locked_until_utc > dt.datetime.now(dt.UTC)  # still valid
        assert failures == []  # the SDK calls back only for a lost lock
        time.sleep(2.5)  # the lock runs out; a clean stop still calls nothing
        assert failures == []
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(message)


def test_lock_renewer_calls_back_for_a_lock_that_is_lost(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    failures: list[tuple[object, Exception | None]] = []
    with AutoLockRenewer(on_lock_renew_failure=lambda r, e: failures.append((r, e))) as renewer:
        receiver, message = locked_message(client, make_queue(lock_duration=1))
        time.sleep(1.5)  # registered too late: the lock has expired
        renewer.register(receiver, message)
        deadline = time.monotonic() + 5
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert failures == [(message, None)]  # as the SDK reports an expired lock


def test_a_receivers_auto_lock_renewer_keeps_the_locks_of_what_it_receives(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2)
    send(client, queue, "long")
    with AutoLockRenewer(max_lock_renewal_duration=30) as renewer:
        receiver = client.get_queue_receiver(queue, max_wait_time=10, auto_lock_renewer=renewer)
        [message] = receiver.receive_messages(1)
        time.sleep(4)
        receiver.complete_message(message)  # the lock was renewed: no MessageLockLostError


def test_peek_goes_on_where_it_stopped_and_sees_later_messages(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(partition_count=1)
    send(client, queue, "a")
    browser = client.get_queue_receiver(queue)
    assert [m.message_id for m in browser.peek_messages(5)] == ["a"]
    assert browser.peek_messages(5) == []
    send(client, queue, "b")
    later = browser.peek_messages(5)
    deadline = time.monotonic() + 10  # once the receiver's fetches saw the new log end
    while not later and time.monotonic() < deadline:
        later = browser.peek_messages(5)
    assert [m.message_id for m in later] == ["b"]
    assert [m.message_id for m in browser.peek_messages(5, sequence_number=1)] == ["a", "b"]


def test_receiver_and_session_methods_honour_timeout_and_refuse_other_keywords(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)
    send(client, queue, "a")
    receiver = client.get_queue_receiver(queue, max_wait_time=10)
    assert [m.message_id for m in receiver.peek_messages(1, timeout=10)] == ["a"]
    [message] = receiver.receive_messages(1)
    assert receiver.renew_message_lock(message, timeout=10) > dt.datetime.now(dt.UTC)
    receiver.defer_message(message)
    assert len(receiver.receive_deferred_messages([message.sequence_number], timeout=10)) == 1
    for call in (receiver.peek_messages, lambda **kw: receiver.renew_message_lock(message, **kw),
                 lambda **kw: receiver.receive_deferred_messages(1, **kw)):
        with pytest.raises(ValueError, match="The timeout must be greater than 0"):
            call(timeout=0)
        with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
            call(no_such_option=1)
    with pytest.raises(TypeError, match="'max_workers' is not supported here: .{20,}"):
        AutoLockRenewer(max_workers=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
        AutoLockRenewer(no_such_option=1)


def test_session_methods_honour_timeout_and_refuse_other_keywords(
        admin: ServiceBusAdministrationClient, client: ServiceBusClient, queue_name: str) -> None:
    admin.create_queue(queue_name, requires_session=True)
    with client.get_queue_receiver(queue_name, session_id="s", max_wait_time=5) as receiver:
        session = receiver.session
        session.set_state("st", timeout=10)
        assert session.get_state(timeout=10) == b"st"
        assert session.renew_lock(timeout=10) > dt.datetime.now(dt.UTC)
        for call in (session.get_state, session.renew_lock,
                     lambda **kw: session.set_state(None, **kw)):
            with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
                call(no_such_option=1)


def test_a_session_receivers_auto_lock_renewer_keeps_the_session_locked(
        admin: ServiceBusAdministrationClient, client: ServiceBusClient, queue_name: str) -> None:
    admin.create_queue(queue_name, requires_session=True, lock_duration=2)
    with client.get_queue_sender(queue_name) as sender:
        sender.send_messages(ServiceBusMessage("x", session_id="s"))
    with AutoLockRenewer(max_lock_renewal_duration=30) as renewer, client.get_queue_receiver(
            queue_name, session_id="s", max_wait_time=10, auto_lock_renewer=renewer) as receiver:
        [message] = receiver.receive_messages(1)
        time.sleep(4)
        receiver.complete_message(message)  # the session's lock, and the message's, held
        assert receiver.session.auto_renew_error is None
