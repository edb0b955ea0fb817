"""Garbage and malformed records on every topic the engine and clients read
neither stop the engine nor lose a message."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
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
