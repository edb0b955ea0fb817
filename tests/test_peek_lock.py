"""Peek-lock settlement against the real broker and a real engine worker."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.exceptions import MessageAlreadySettled, MessageLockLostError

#: Core settlement: in the compatibility subset that also runs on Tansu.
pytestmark = pytest.mark.tansu


def send(client: ServiceBusClient, queue: str, *bodies: str) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b, message_id=b) for b in bodies])


def test_locked_message_is_invisible_to_a_second_receiver_until_the_lock_ends(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2)
    send(client, queue, "only")
    first = client.get_queue_receiver(queue)
    second = client.get_queue_receiver(queue)
    held = first.receive_messages(1, max_wait_time=10)
    assert [str(m) for m in held] == ["only"]
    assert second.receive_messages(1, max_wait_time=1) == []
    again = second.receive_messages(1, max_wait_time=10)
    assert [str(m) for m in again] == ["only"] and again[0].delivery_count == 1


def test_complete_removes_the_message(client: ServiceBusClient,
                                      make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    send(client, queue, "done")
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    receiver.complete_message(message)
    assert receiver.receive_messages(1, max_wait_time=2.5) == []


def test_abandon_makes_it_available_at_once_with_delivery_count_plus_one(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30)
    send(client, queue, "again")
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    assert message.delivery_count == 0
    receiver.abandon_message(message)
    started = time.monotonic()
    [redelivered] = receiver.receive_messages(1, max_wait_time=10)
    assert time.monotonic() - started < 5  # not after the 30 s lock
    assert str(redelivered) == "again" and redelivered.delivery_count == 1


def test_max_delivery_count_moves_the_message_to_the_dead_letter_sub_queue(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(max_delivery_count=2)
    send(client, queue, "poison")
    receiver = client.get_queue_receiver(queue)
    for expected_count in (0, 1):  # the SDK's count: earlier deliveries
        [message] = receiver.receive_messages(1, max_wait_time=10)
        assert message.delivery_count == expected_count
        receiver.abandon_message(message)
    assert receiver.receive_messages(1, max_wait_time=1) == []
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(1, max_wait_time=10)
    assert str(dead) == "poison"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert "2" in (dead.dead_letter_error_description or "")


def test_lapsed_locks_count_toward_max_delivery(client: ServiceBusClient,
                                                make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1, max_delivery_count=2)
    send(client, queue, "slow")
    receiver = client.get_queue_receiver(queue)
    assert len(receiver.receive_messages(1, max_wait_time=10)) == 1
    assert len(receiver.receive_messages(1, max_wait_time=10)) == 1  # after the lapse
    time.sleep(1.5)
    dlq = client.get_queue_receiver(f"{queue}/$deadletterqueue")
    [dead] = dlq.receive_messages(1, max_wait_time=10)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


def test_dead_letter_message_keeps_reason_and_description(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    send(client, queue, "bad")
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    receiver.dead_letter_message(message, reason="Invalid", error_description="no customer id")
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(1, max_wait_time=10)
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
        "Invalid", "no customer id")
    assert dead.dead_letter_source == queue and dead.message_id == "bad"


def test_defer_then_receive_deferred_by_sequence_number(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    send(client, queue, "later", "now")
    receiver = client.get_queue_receiver(queue)
    [later] = receiver.receive_messages(1, max_wait_time=10)
    receiver.defer_message(later)
    [now] = receiver.receive_messages(5, max_wait_time=10)
    assert str(now) == "now"
    receiver.complete_message(now)
    [fetched] = receiver.receive_deferred_messages([later.sequence_number])
    assert str(fetched) == "later" and fetched.lock_token
    assert fetched.locked_until_utc > dt.datetime.now(dt.UTC)
    receiver.complete_message(fetched)
    assert receiver.receive_deferred_messages([later.sequence_number]) == []


def test_renew_message_lock_moves_locked_until_forward(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2)
    send(client, queue, "long job")
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    before = message.locked_until_utc
    time.sleep(1.2)
    after = receiver.renew_message_lock(message)
    assert after > before and message.locked_until_utc == after
    time.sleep(1.2)  # past the first lock's end, inside the renewed one
    receiver.complete_message(message)


def test_settling_after_the_lock_lapsed_raises_lock_lost(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    send(client, queue, "too slow")
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    time.sleep(1.5)
    with pytest.raises(MessageLockLostError, match="lock"):
        receiver.complete_message(message)


def test_settling_twice_raises_message_already_settled(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    send(client, queue, "once")
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    receiver.complete_message(message)
    with pytest.raises(MessageAlreadySettled):
        receiver.abandon_message(message)
    assert isinstance(MessageAlreadySettled(), ValueError)
