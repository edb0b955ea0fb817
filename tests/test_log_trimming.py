"""The log start of an entity partition follows its oldest unsettled message
(DeleteRecords), so a queue's or topic's disk use follows its backlog, not its
history; nothing unsettled is ever deleted."""

from __future__ import annotations

import time
from collections.abc import Callable

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.management import ServiceBusAdministrationClient
from tests.helpers import log_bounds, receive_exactly, wait_for_log_start
from topics import names
from topics.entities import DEFAULT_ENGINE_PARTITIONS
from topics.offsets import committed_offsets
from topics.partitions import command_partition


def test_log_start_advances_to_the_oldest_message_still_needed(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    # The namespace's own window (its limits are read through it) has no log
    # to trim, and must not stop the trimming of the others.
    admin.update_namespace_properties(max_commands_per_second=None)
    queue = make_queue(lock_duration=30)
    log = names.entity_log(client.settings.namespace, queue)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=str(i)) for i in range(20)])
    with client.get_queue_receiver(queue) as receiver:
        first = receive_exactly(receiver, 20)
        assert [m.message_id for m in first] == [str(i) for i in range(20)]
        receiver.complete_messages(first[:5])
        receiver.dead_letter_message(first[5], reason="Bad", error_description="test")
        receiver.complete_messages(first[6:10])
        receiver.defer_message(first[10])
        receiver.complete_messages(first[11:])
        wait_for_log_start(client, log, 5)  # the dead letter at offset 5 holds it

        with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            dead = receive_exactly(dlq, 1)
            assert dead[0].message_id == "5" and dead[0].dead_letter_reason == "Bad"
            dlq.complete_message(dead[0])
        wait_for_log_start(client, log, 10)  # now the deferred message at offset 10

        deferred = receiver.receive_deferred_messages([first[10].sequence_number])
        assert [m.message_id for m in deferred] == ["10"]
        receiver.complete_message(deferred[0])
    wait_for_log_start(client, log, 20)  # all settled: the log holds nothing

    with client.get_queue_sender(queue) as sender:  # and the queue goes on from there
        sender.send_messages(ServiceBusMessage("after", message_id="20"))
    with client.get_queue_receiver(queue) as receiver:
        again = receive_exactly(receiver, 1)
        assert again[0].message_id == "20" and again[0].delivery_count == 0
        receiver.complete_message(again[0])


def test_a_topics_log_start_moves_once_every_subscription_settled_past_it(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        queue_name: str) -> None:
    """A topic's log is shared: it is trimmed to the oldest offset any of its
    subscriptions still needs, never past what one of them has not settled."""
    topic = queue_name
    admin.create_topic(topic)
    for subscription in ("a", "b"):
        admin.create_subscription(topic, subscription, lock_duration=30)
    log = names.topic_log(client.settings.namespace, topic)
    with client.get_topic_sender(topic) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=str(i)) for i in range(10)])
    with client.get_subscription_receiver(topic, "a") as a:
        a.complete_messages(receive_exactly(a, 10))
    with client.get_subscription_receiver(topic, "b") as b:
        got = receive_exactly(b, 10)
        b.complete_messages(got[:4])
        wait_for_log_start(client, log, 4)  # b has not settled offset 4
        b.complete_messages(got[4:])
    wait_for_log_start(client, log, 10)  # every subscription settled everything


def test_the_commands_log_starts_where_the_engine_applied_them(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """The commands partitions are trimmed up to the offsets the engine's
    group committed as applied, and never past them: a command before them
    is read by no worker again."""
    queue = make_queue(lock_duration=30, partition_count=1)
    namespace = client.settings.namespace
    commands = names.commands(namespace)
    partition = command_partition(f"{queue}#0", DEFAULT_ENGINE_PARTITIONS)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=str(i)) for i in range(5)])
    with client.get_queue_receiver(queue) as receiver:
        got = receive_exactly(receiver, 5)
        assert all(r.succeeded for r in receiver.complete_messages(got))
    _, end = log_bounds(client, commands, partition)  # this test's commands are before it
    assert end > 0
    deadline = time.monotonic() + 45  # committed every 1 s, trimmed every 5 s, 10 s later
    while (start := log_bounds(client, commands, partition)[0]) < end \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert start >= end, f"the commands log of partition {partition} starts at {start}, " \
                         f"not past this test's commands (before {end})"
    committed = committed_offsets(client.settings.kafka_config(),
                                  names.engine_app_id(namespace), commands, [partition], 10)
    assert start <= committed[partition], (start, committed)
