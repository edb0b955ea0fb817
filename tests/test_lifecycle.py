"""Message lifecycle: time to live and scheduled messages, end to end."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusSubQueue,
)
from settlement.exceptions import MessageNotFoundError
from settlement.management import ServiceBusAdministrationClient
from tests.helpers import drain_ids, last_state
from topics import names

#: Core settlement: in the compatibility subset that also runs on Tansu.
pytestmark = pytest.mark.tansu


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def test_expired_message_is_never_delivered_and_dropped_with_an_event(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([
            ServiceBusMessage("short", message_id="short", time_to_live=dt.timedelta(seconds=1)),
            ServiceBusMessage("long", message_id="long", time_to_live=dt.timedelta(hours=1))])
    time.sleep(1.5)
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(5, max_wait_time=10)
    assert message.message_id == "long"
    assert message.expires_at_utc == message.enqueued_time_utc + dt.timedelta(hours=1)
    receiver.complete_message(message)
    props = admin.get_queue_runtime_properties(queue)
    assert props.active_message_count == 0 and props.dead_letter_message_count == 0


def test_expired_message_is_dead_lettered_when_the_queue_says_so(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(dead_lettering_on_message_expiration=True,
                       default_message_time_to_live=1)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("stale", message_id="stale",
                                               time_to_live=dt.timedelta(hours=1)))
    time.sleep(1.5)  # the queue's 1 s default is smaller than the message's hour: it wins
    assert client.get_queue_receiver(queue).receive_messages(5, max_wait_time=2) == []
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    [dead] = dlq.receive_messages(5, max_wait_time=10)
    assert dead.message_id == "stale" and dead.dead_letter_reason == "TTLExpiredException"
    assert dead.dead_letter_error_description
    time.sleep(1.2)  # dead letters never expire
    dlq.abandon_message(dead)
    [again] = dlq.receive_messages(5, max_wait_time=10)
    assert again.message_id == "stale"


def test_scheduled_message_is_invisible_until_due_and_counted(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    due = now() + dt.timedelta(seconds=4)
    with client.get_queue_sender(queue) as sender:
        [seq] = sender.schedule_messages(ServiceBusMessage("later", message_id="later"), due)
        sender.send_messages(ServiceBusMessage("now", message_id="now"))
    props = admin.get_queue_runtime_properties(queue)
    assert props.scheduled_message_count == 1 and props.active_message_count == 1
    [peeked_later, peeked_now] = client.get_queue_receiver(queue).peek_messages(5)
    assert peeked_later.state == ServiceBusMessageState.SCHEDULED
    assert peeked_later.sequence_number == seq and peeked_now.message_id == "now"
    assert drain_ids(client, queue, wait=0.5) == ["now"]
    receiver = client.get_queue_receiver(queue)
    [later] = receiver.receive_messages(1, max_wait_time=10)
    assert later.message_id == "later" and now() >= due and later.delivery_count == 0
    receiver.complete_message(later)
    assert admin.get_queue_runtime_properties(queue).scheduled_message_count == 0


def test_cancelled_scheduled_messages_are_never_delivered(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        seqs = sender.schedule_messages([ServiceBusMessage("a", message_id="a"),
                                         ServiceBusMessage("b", message_id="b")],
                                        now() + dt.timedelta(seconds=3))
        sender.cancel_scheduled_messages(seqs[0])
        with pytest.raises(MessageNotFoundError, match=str(seqs[0])):
            sender.cancel_scheduled_messages([seqs[0]])
    time.sleep(3.2)
    assert drain_ids(client, queue) == ["b"]


def test_a_record_scheduled_by_another_producer_is_held_back_by_the_receiver(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    due_ms = int((now() + dt.timedelta(seconds=1.5)).timestamp() * 1000)
    producer = Producer(client.settings.kafka_config())
    producer.produce(names.entity_log(client.settings.namespace, queue), b"x",
                     headers=[("message-id", b"foreign"),
                              ("scheduled-enqueue-time-ms", str(due_ms).encode())])
    assert producer.flush(10) == 0
    receiver = client.get_queue_receiver(queue)
    assert receiver.receive_messages(1, max_wait_time=0.5) == []
    [message] = receiver.receive_messages(1, max_wait_time=10)
    assert message.message_id == "foreign" and message.delivery_count == 0
    assert time.time() * 1000 >= due_ms


def test_engine_expires_a_sent_message_on_its_timer_with_no_receiver(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(dead_lettering_on_message_expiration=True)
    with client.get_queue_sender(queue) as sender:  # the sender tells the engine its expiry
        sender.send_messages([ServiceBusMessage("brief", message_id="brief",
                                                time_to_live=dt.timedelta(seconds=1)),
                              ServiceBusMessage("stays", message_id="stays")])
    last = last_state(client, queue, lambda state: state["dead_letter"] == 1)
    assert last.get("dead_letter") == 1, last
    props = admin.get_queue_runtime_properties(queue)  # it reads the true log end
    assert (props.active_message_count, props.dead_letter_message_count) == (1, 1)
