"""Garbage and malformed records on every topic the engine and clients read
neither stop the engine nor lose a message."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement._log_reader import PartitionReader
from settlement.management import ServiceBusAdministrationClient
from settlement.receiver import MALFORMED_REASON
from tests.wire_commands import call_raw
from topics import names, specs
from topics.commands import (
    Command,
    ReplyAddress,
    StatsArgs,
    decode_reply,
    encode_command,
)
from topics.entities import DEFAULT_ENGINE_PARTITIONS
from topics.errors import ErrorCode
from topics.offsets import log_end_offsets
from topics.partitions import command_partition
from topics.sequence_numbers import split_sequence_number


def raw_producer(client: ServiceBusClient) -> Producer:
    return Producer(client.settings.kafka_config())


def round_trip(client: ServiceBusClient, queue: str) -> None:
    """The engine still works: a message goes in, is received and completed."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("still alive"))
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=15)
    receiver.complete_message(message)


def test_garbage_on_every_engine_topic_does_not_stop_the_engine(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    ns = client.settings.namespace
    producer = raw_producer(client)
    for topic, partitions in ((names.commands(ns), DEFAULT_ENGINE_PARTITIONS),
                              (names.replies(ns), specs.REPLY_PARTITIONS)):
        for partition in range(partitions):
            producer.produce(topic, os.urandom(64), key=os.urandom(8), partition=partition)
            producer.produce(topic, None, partition=partition)  # a null value
            producer.produce(topic, b'{"v": 1, "id": 5}', partition=partition)
    producer.produce(names.entities(ns), b"\xff\xfe not json", key=b"broken", partition=0)
    assert producer.flush(10) == 0
    round_trip(client, queue)
    admin = ServiceBusAdministrationClient._from_settings(client.settings)
    assert queue in [q.name for q in admin.list_queues()]  # the broken definition is skipped
    admin.close()


def test_malformed_command_gets_an_error_reply(client: ServiceBusClient,
                                               make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    link = client.get_queue_receiver(queue)._link
    reply = call_raw(link, "explode", queue, 0)
    assert not reply.ok and reply.error_code == ErrorCode.BAD_COMMAND
    assert "unknown operation" in reply.error_message
    reply = call_raw(link, "settle", queue, 0, items=[[0, "t", "melt", None, None]])
    assert not reply.ok and "action" in reply.error_message
    round_trip(client, queue)


def test_misrouted_command_is_refused(client: ServiceBusClient,
                                      make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    ns = client.settings.namespace
    replies = Consumer(client.settings.consumer_config("misrouted-test"))
    reply_topic = names.replies(ns)
    ends = log_end_offsets(replies, [(reply_topic, 0)],
                           exact=client.settings.profile.exact_list_offsets)
    replies.assign([TopicPartition(reply_topic, 0, ends[(reply_topic, 0)])])
    cmd = Command("misrouted-" + queue, queue, 0, StatsArgs(0), ReplyAddress(0, "misrouted-test"))
    right = command_partition(cmd.window_key, DEFAULT_ENGINE_PARTITIONS)
    producer = raw_producer(client)
    producer.produce(names.commands(ns), encode_command(cmd), key=cmd.window_key.encode(),
                     partition=(right + 1) % DEFAULT_ENGINE_PARTITIONS)
    assert producer.flush(10) == 0
    deadline = time.monotonic() + 20
    reply = None
    while reply is None and time.monotonic() < deadline:
        for record in replies.consume(100, timeout=0.2):
            decoded = decode_reply(record.value())
            if decoded is not None and decoded.id == cmd.id:
                reply = decoded
    replies.close()
    assert reply is not None and not reply.ok and reply.error_code == ErrorCode.MISROUTED
    round_trip(client, queue)


def test_malformed_record_in_the_log_goes_to_the_dead_letter_sub_queue(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    topic = names.entity_log(client.settings.namespace, queue)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("before", message_id="before"))
    producer = raw_producer(client)
    producer.produce(topic, b"\x00\x01 payload", partition=0,
                     headers=[("application-properties", b"{not json")])
    producer.produce(topic, b"plain record", partition=0)  # no headers: a valid message
    assert producer.flush(10) == 0
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("after", message_id="after"))
    receiver = client.get_queue_receiver(queue)
    bodies = []
    while batch := receiver.receive_messages(10, max_wait_time=3):
        bodies += [str(m) for m in batch]
        receiver.complete_messages(batch)
    assert bodies == ["before", "plain record", "after"]
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(5, max_wait_time=10)
    assert b"".join(dead.body) == b"\x00\x01 payload"
    assert dead.dead_letter_reason == MALFORMED_REASON
    assert "application-properties" in dead.dead_letter_error_description


def test_records_read_while_the_engine_locks_them_are_those_granted(
        client: ServiceBusClient, make_queue: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver that drains a queue in order in batches of 100 reads the
    records of its next grants while the engine locks them: each message is
    the one its grant names, and a malformed record among them is still
    dead-lettered, never handed out."""
    queue = make_queue(lock_duration=60)
    topic = names.entity_log(client.settings.namespace, queue)

    def messages(first: int, stop: int) -> list[ServiceBusMessage]:
        return [ServiceBusMessage(f"body {i}", message_id=f"m{i}",
                                  application_properties={"i": i}) for i in range(first, stop)]

    with client.get_queue_sender(queue) as sender:
        sender.send_messages(messages(0, 250))
        producer = raw_producer(client)
        producer.produce(topic, b"\x00\x01 payload", partition=0,
                         headers=[("application-properties", b"{not json")])
        assert producer.flush(10) == 0
        sender.send_messages(messages(250, 450))
    read_ahead: set[int] = set()
    at_hand = PartitionReader.at_hand

    def noted(reader: PartitionReader, offsets: range) -> dict[int, Message]:
        found = at_hand(reader, offsets)
        read_ahead.update(found)
        return found

    monkeypatch.setattr(PartitionReader, "at_hand", noted)
    receiver = client.get_queue_receiver(queue)
    got = []
    while batch := receiver.receive_messages(100, max_wait_time=3):
        got += batch
        receiver.complete_messages(batch)
    assert [(m.message_id, str(m), m.application_properties) for m in got] == [
        (f"m{i}", f"body {i}", {"i": i}) for i in range(450)]
    offsets = [split_sequence_number(m.sequence_number)[1] for m in got]
    assert offsets == sorted(set(offsets))
    assert 250 in read_ahead  # the malformed record's offset was read ahead too
    assert len(read_ahead & set(offsets)) >= 200  # the third batch on
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(5, max_wait_time=10)
    assert b"".join(dead.body) == b"\x00\x01 payload"
    assert dead.dead_letter_reason == MALFORMED_REASON
