"""peek_messages browses without locking and shows each message's state."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusSubQueue,
)
from settlement.exceptions import InvalidOperationError


def test_peek_shows_active_locked_and_deferred_messages_without_locking(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)])
    receiver = client.get_queue_receiver(queue)
    taken = receiver.receive_messages(3, max_wait_time=10)
    while len(taken) < 3:
        taken += receiver.receive_messages(3 - len(taken), max_wait_time=10)
    receiver.complete_message(taken[0])
    receiver.defer_message(taken[1])  # taken[2] stays locked

    browser = client.get_queue_receiver(queue)
    peeked = browser.peek_messages(10)
    assert [(m.message_id, m.state) for m in peeked] == [
        ("m1", ServiceBusMessageState.DEFERRED), ("m2", ServiceBusMessageState.ACTIVE),
        ("m3", ServiceBusMessageState.ACTIVE), ("m4", ServiceBusMessageState.ACTIVE)]
    assert all(m.lock_token is None for m in peeked)
    with pytest.raises(InvalidOperationError, match="peeked"):
        browser.complete_message(peeked[2])
    # peeking locked nothing: m3 and m4 are still there to receive
    fresh = browser.receive_messages(5, max_wait_time=10)
    assert [m.message_id for m in fresh] == ["m3", "m4"]


def test_peek_pages_by_sequence_number(client: ServiceBusClient,
                                       make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(6)])
    browser = client.get_queue_receiver(queue)
    first = browser.peek_messages(4)
    second = browser.peek_messages(4)
    assert [m.message_id for m in first + second] == [f"m{i}" for i in range(6)]
    again = browser.peek_messages(2, sequence_number=first[2].sequence_number)
    assert [m.message_id for m in again] == ["m2", "m3"]


def test_peek_on_the_dead_letter_sub_queue(client: ServiceBusClient,
                                           make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("bad", message_id="bad")])
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    receiver.dead_letter_message(message, reason="Broken", error_description="why")
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [peeked] = dlq.peek_messages(5)
    assert (peeked.message_id, peeked.dead_letter_reason) == ("bad", "Broken")
    [still] = dlq.receive_messages(1, max_wait_time=10)  # peek did not lock it
    assert still.message_id == "bad"
