"""Send settlement: acknowledged, refused with clear errors, bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import MessageSizeExceededError, MessagingEntityNotFoundError
from topics import names
from topics.offsets import log_end_offsets

#: Core settlement: in the compatibility subset that also runs on Tansu.
pytestmark = pytest.mark.tansu


def test_send_returns_after_the_broker_acknowledged(client: ServiceBusClient,
                                                    make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(50)])
    topic = names.entity_log(client.settings.namespace, queue)
    consumer = Consumer(client.settings.consumer_config("check-send"))
    try:  # right after the call returns, every record is in the log
        exact = client.settings.profile.exact_list_offsets
        assert log_end_offsets(consumer, [(topic, 0)], exact=exact)[(topic, 0)] == 50
    finally:
        consumer.close()


def test_unknown_queue_raises_entity_not_found(client: ServiceBusClient) -> None:
    with client.get_queue_sender("no-such-queue") as sender:
        with pytest.raises(MessagingEntityNotFoundError, match="no-such-queue"):
            sender.send_messages(ServiceBusMessage("x"))
    with pytest.raises(MessagingEntityNotFoundError, match="create it"):
        client.get_queue_receiver("no-such-queue")


def test_message_over_the_size_limit_is_refused(client: ServiceBusClient,
                                                make_queue: Callable[..., str]) -> None:
    queue = make_queue(max_message_size_in_kilobytes=64)
    with client.get_queue_sender(queue) as sender:
        with pytest.raises(MessageSizeExceededError, match="at most 65536") as info:
            sender.send_messages(ServiceBusMessage(b"x" * 70_000))
        assert info.value.retryable is False and info.value.tracking_id
        batch = sender.create_message_batch()
        batch.add_message(ServiceBusMessage(b"x" * 60_000))
        with pytest.raises(MessageSizeExceededError, match="new one"):
            batch.add_message(ServiceBusMessage(b"x" * 10_000))
        sender.send_messages(batch)


def test_pipelined_sends_are_bounded(client: ServiceBusClient,
                                     make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue, max_in_flight=16) as sender:
        threads = [threading.Thread(target=sender.send_messages,
                                    args=([ServiceBusMessage(b"y" * 512) for _ in range(200)],))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 1 < sender.peak_in_flight <= 16
    receiver = client.get_queue_receiver(queue)
    got = 0
    while batch := receiver.receive_messages(500, max_wait_time=3):
        got += len(receiver.complete_messages(batch))
    assert got == 800


def test_message_ids_and_properties_survive_the_log(client: ServiceBusClient,
                                                    make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(
            "body", message_id="id-1", correlation_id="c", subject="s", content_type="text/plain",
            application_properties={"n": 1, "f": 1.5, "b": True, "s": "x", "none": None}))
    [message] = client.get_queue_receiver(queue).receive_messages(1, max_wait_time=10)
    assert (message.message_id, message.correlation_id, message.subject, message.content_type) \
        == ("id-1", "c", "s", "text/plain")
    assert message.application_properties == {"n": 1, "f": 1.5, "b": True, "s": "x", "none": None}
    assert message.enqueued_time_utc is not None
