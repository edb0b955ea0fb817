"""A queue's policy lives with its definition: ``update_queue`` takes effect
for new locks at once, and no client resets it with what it cached."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from settlement.management import ServiceBusAdministrationClient


def _lock_seconds(message: ServiceBusReceivedMessage) -> float:
    until = message.locked_until_utc
    assert until is not None, "a message received in peek-lock mode is locked until a time"
    return (until - dt.datetime.now(dt.UTC)).total_seconds()


def test_a_client_created_before_update_queue_follows_the_new_lock_duration(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=60, max_delivery_count=10)
    with client.get_queue_receiver(queue) as receiver:  # it read the 60 s definition
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        first = receiver.receive_messages(1, max_wait_time=10)
        assert 50 < _lock_seconds(first[0]) <= 60

        props = admin.get_queue(queue)
        props.lock_duration = dt.timedelta(seconds=3)
        props.max_delivery_count = 2
        admin.update_queue(props)
        assert admin.get_queue(queue).lock_duration == dt.timedelta(seconds=3)

        second = receiver.receive_messages(1, max_wait_time=10)
        assert 1 < _lock_seconds(second[0]) <= 3
        # The old client's commands carry no policy: the next lock is short too,
        # and the lock really lapses after 3 s.
        time.sleep(3.5)
        again = receiver.receive_messages(3, max_wait_time=10)
        redelivered = [m for m in again if m.sequence_number == second[0].sequence_number]
        assert redelivered and redelivered[0].delivery_count == 1
        assert all(_lock_seconds(m) <= 3 for m in again)
        receiver.complete_message(first[0])  # its 60 s lock, taken before, still holds


def test_update_queue_refuses_to_change_the_partition_count(
        admin: ServiceBusAdministrationClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(partition_count=2)
    props = admin.get_queue(queue)
    props.partition_count = 4
    with pytest.raises(ValueError, match="partition_count .* cannot change"):
        admin.update_queue(props)
    assert admin.get_queue(queue).partition_count == 2
