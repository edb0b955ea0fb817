"""Receive-and-delete, the dead-letter sub-queue and runtime counts."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from settlement.exceptions import InvalidOperationError, MessagingEntityNotFoundError
from settlement.management import ServiceBusAdministrationClient


def send(client: ServiceBusClient, queue: str, count: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                              for i in range(count)])


def test_receive_and_delete_never_delivers_a_message_again(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    send(client, queue, 20)
    receiver = client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    received = []
    while batch := receiver.receive_messages(7, max_wait_time=2):
        received += batch
    assert sorted(m.message_id for m in received) == sorted(f"m{i}" for i in range(20))
    time.sleep(1.5)  # longer than any lock: nothing may come back
    peek_lock = client.get_queue_receiver(queue)
    assert peek_lock.receive_messages(10, max_wait_time=1.5) == []
    with pytest.raises(InvalidOperationError, match="RECEIVE_AND_DELETE"):
        receiver.complete_message(received[0])


def test_dead_letter_sub_queue_is_read_with_peek_lock_and_complete_removes(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    send(client, queue, 2)
    receiver = client.get_queue_receiver(queue)
    for message in receiver.receive_messages(2, max_wait_time=10):
        receiver.dead_letter_message(message, reason="R", error_description="D")
    dlq = client.get_queue_receiver(f"{queue}/$deadletterqueue")
    first = dlq.receive_messages(2, max_wait_time=10)
    assert len(first) == 2
    dlq.abandon_message(first[0])
    with pytest.raises(InvalidOperationError, match="cannot be dead-lettered"):
        dlq.dead_letter_message(first[1])
    dlq.complete_message(first[1])
    time.sleep(3)  # dead letters never expire: locks lapse, the message stays
    [left] = dlq.receive_messages(5, max_wait_time=10)
    assert left.message_id == first[0].message_id and left.dead_letter_reason == "R"
    dlq.complete_message(left)
    assert dlq.receive_messages(5, max_wait_time=1) == []


def test_runtime_counts_follow_each_kind_of_settlement(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30)
    send(client, queue, 6)

    def counts() -> tuple[int, int, int, int]:
        props = admin.get_queue_runtime_properties(queue)
        return (props.active_message_count, props.dead_letter_message_count,
                props.deferred_message_count, props.locked_message_count)

    assert counts() == (6, 0, 0, 0)
    receiver = client.get_queue_receiver(queue)
    messages = receiver.receive_messages(6, max_wait_time=10)
    while len(messages) < 6:
        messages += receiver.receive_messages(6 - len(messages), max_wait_time=10)
    assert counts() == (6, 0, 0, 6)
    receiver.complete_message(messages[0])
    assert counts() == (5, 0, 0, 5)
    receiver.abandon_message(messages[1])
    assert counts() == (5, 0, 0, 4)
    receiver.dead_letter_message(messages[2], reason="x")
    assert counts() == (4, 1, 0, 3)
    receiver.defer_message(messages[3])
    assert counts() == (3, 1, 1, 2)
    receiver.complete_messages(messages[4:])
    assert counts() == (1, 1, 1, 0)
    assert admin.get_queue_runtime_properties(queue).total_message_count == 3


def test_delete_queue_removes_log_definition_and_window(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    send(client, queue, 3)
    admin.delete_queue(queue)
    with pytest.raises(MessagingEntityNotFoundError, match=queue):
        admin.get_queue(queue)
    assert queue not in [q.name for q in admin.list_queues()]
    admin.create_queue(queue, lock_duration=2)  # the name is free again, and empty
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0
    send(client, queue, 1)
    [message] = client.get_queue_receiver(queue).receive_messages(5, max_wait_time=10)
    assert message.message_id == "m0" and message.delivery_count == 0


def test_size_in_bytes_counts_the_records_still_in_the_queue(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b"x" * 1000, message_id=f"m{i}")
                              for i in range(4)])
    first = admin.get_queue_runtime_properties(queue).size_in_bytes
    assert 4 * 1000 < first < 4 * 1100  # bodies plus keys and headers
    receiver = client.get_queue_receiver(queue)
    batch = receiver.receive_messages(2, max_wait_time=10)
    receiver.complete_messages(batch)
    left = admin.get_queue_runtime_properties(queue).size_in_bytes
    assert left == first - sum(1000 + 2 * len(m.message_id) + len("message-id")
                               for m in batch)
