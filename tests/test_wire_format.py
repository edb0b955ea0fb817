"""The message log's wire format (docs/wire-format.md): any Kafka client can
produce to a queue, and the limits of the seeds hold on both sides."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
)
from settlement.exceptions import MessageSizeExceededError
from settlement.message_records import decode, encode
from topics import names
from topics.message_record import HEADER_SIZE_EXCEEDED, MalformedRecord


def test_a_plain_kafka_producer_following_the_document_is_received_like_a_sender(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    fields = dict(message_id="order-7", correlation_id="c-1", content_type="application/json",
                  subject="created", reply_to="replies", to="shop", session_id="s-1",
                  application_properties={"tenant": "a", "n": 3, "ok": True},
                  time_to_live=dt.timedelta(hours=1))
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(b'{"id": 7}', **fields))
    producer = Producer(client.settings.kafka_config())
    producer.produce(names.entity_log(client.settings.namespace, queue), b'{"id": 7}',
                     key=b"s-1", headers=[
                         ("message-id", b"order-7"), ("correlation-id", b"c-1"),
                         ("content-type", b"application/json"), ("subject", b"created"),
                         ("reply-to", b"replies"), ("to", b"shop"), ("session-id", b"s-1"),
                         ("time-to-live-ms", b"3600000"),
                         ("application-properties",
                          json.dumps({"tenant": "a", "n": 3, "ok": True}).encode()),
                         ("x-other-system", b"ignored")])
    assert producer.flush(10) == 0
    receiver = client.get_queue_receiver(queue)
    got = receiver.receive_messages(2, max_wait_time=10)
    while len(got) < 2:
        got += receiver.receive_messages(1, max_wait_time=10)
    ours, theirs = got

    def shape(m: ServiceBusReceivedMessage) -> tuple[object, ...]:
        return (b"".join(m.body), m.message_id, m.correlation_id, m.content_type, m.subject,
                m.reply_to, m.to, m.session_id, m.application_properties, m.time_to_live)

    assert shape(ours) == shape(theirs)
    assert theirs.expires_at_utc == theirs.enqueued_time_utc + dt.timedelta(hours=1)


def test_client_refuses_oversize_headers_and_ids() -> None:
    with pytest.raises(MessageSizeExceededError, match="one property"):
        encode(ServiceBusMessage("x", application_properties={"big": "y" * 33_000}))
    with pytest.raises(MessageSizeExceededError, match="headers"):
        encode(ServiceBusMessage("x", application_properties={
            f"p{i}": "y" * 20_000 for i in range(4)}))
    with pytest.raises(ValueError, match="128"):
        ServiceBusMessage("x", message_id="m" * 129)
    with pytest.raises(ValueError, match="128"):
        ServiceBusMessage("x", session_id="s" * 129)


def test_record_with_oversize_headers_goes_to_the_dead_letter_sub_queue(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    producer = Producer(client.settings.kafka_config())
    producer.produce(names.entity_log(client.settings.namespace, queue), b"huge headers",
                     headers=[(f"x-h{i}", b"z" * 30_000) for i in range(3)])
    assert producer.flush(10) == 0
    receiver = client.get_queue_receiver(queue)
    assert receiver.receive_messages(1, max_wait_time=3) == []
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(1, max_wait_time=10)
    assert b"".join(dead.body) == b"huge headers"
    assert dead.dead_letter_reason == HEADER_SIZE_EXCEEDED


def test_a_record_with_an_over_long_id_header_is_malformed() -> None:
    headers = [("message-id", b"m" * 129), ("subject", b"kept")]
    with pytest.raises(MalformedRecord, match="'message-id' is 129 characters"):
        decode(b"body", headers, 0, 0, 7)
    lenient = decode(b"body", headers, 0, 0, 7, lenient=True)
    assert lenient.message_id is None and lenient.subject == "kept"
    assert "128" in (lenient.malformed_reason or "")


def test_a_received_message_is_one_object_for_the_garbage_collector() -> None:
    """A receive builds one message per record and the application holds
    its batch while settling: no ``__dict__`` made beside each (a second
    object per message for the collector to walk), however it is built,
    delivered and settled, until the application asks for its properties.
    In a fresh interpreter, as an application's: CPython keeps a class's
    instance attributes in the objects for its first 30 attribute names,
    and this suite's other tests give messages names of their own."""
    subprocess.run([sys.executable, "-c", _ONE_OBJECT_A_MESSAGE], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parent.parent)


_ONE_OBJECT_A_MESSAGE = """
import gc

from settlement import ServiceBusMessage
from settlement.message_records import decode, encode

key, value, headers = encode(ServiceBusMessage(b"x", message_id="m",
                                               application_properties={"color": "red"}))
holder = [object()]  # what a received message points at: its receiver
gc.collect()
before = len(gc.get_objects())
received = []
for offset in range(1000):
    message = decode(value, headers, 0, 0, offset, lock_token="t", delivery_count=0)
    ahead = decode(value, headers, 0, 0, offset)  # read ahead of its grant...
    ahead._deliver(lock_token="t", delivery_count=0)  # ...then delivered
    for each in (message, ahead):
        each._receiver = holder
        each._settled = True
        each._lock_spent = True
    received += [message, ahead]
gc.collect()
# a few objects more or less are the test's own (the list holding them)
per_message = (len(gc.get_objects()) - before) / len(received)
assert per_message < 1.1, f"{per_message} objects a received message"
assert gc.is_tracked(received[0]) and received[1]._granted_token == "t"
assert received[0].application_properties[b"color"] == b"red"
received[1].application_properties = {"shade": "dark"}
assert received[1].application_properties == {"shade": "dark"}
assert received[2].message_id == "m" and received[2].offset == 1
assert received[2].enqueued_sequence_number == received[2].sequence_number
"""
