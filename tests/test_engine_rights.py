"""Only the engine speaks to itself: a client that can write the commands
topic (every receiver can) cannot make the engine expire, accept, forget or
redefine anything, nor settle a lock it was not given. These refusals are the
engine's own, so they hold on a broker without an authorizer too."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from settlement._engine_link import check_reply
from settlement.exceptions import MessageLockLostError, ServiceBusAuthorizationError
from settlement.management import ServiceBusAdministrationClient
from settlement.receiver import ServiceBusReceiver
from tests.wire_commands import call_raw, raw_command
from topics import names
from topics.errors import ErrorCode
from topics.partitions import command_partition


def send(client: ServiceBusClient, queue: str, count: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                              for i in range(count)])


def receive(receiver: ServiceBusReceiver, count: int) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < count:
        batch = receiver.receive_messages(count - len(got), max_wait_time=10)
        assert batch, f"only {len(got)} of {count} messages came"
        got += batch
    return got


FORGED = [
    ("expire", {}),
    ("accept", {"from": 0, "to": 100, "items": [[o, 1, 0, 1] for o in range(100)]}),
    ("dead_forwarded", {"offsets": list(range(100))}),
    ("drop", {}),
    ("define", {"version": 1 << 40}),
]


@pytest.mark.parametrize("op, args", FORGED, ids=[op for op, _ in FORGED])
def test_a_forged_engine_or_admin_operation_is_refused_and_changes_nothing(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str], op: str, args: dict[str, object]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)
    send(client, queue, 100)
    receiver = client.get_queue_receiver(queue)
    done = receive(receiver, 50)
    assert all(r.succeeded for r in receiver.complete_messages(done))
    link = receiver._link
    reply = call_raw(link, op, queue, 0, **args)
    assert not reply.ok and reply.error_code == ErrorCode.UNAUTHORIZED
    assert op in reply.error_message
    with pytest.raises(ServiceBusAuthorizationError, match=queue):
        check_reply(reply, queue)
    # The same, produced by a plain Kafka producer with a policy riding along.
    body = raw_command(op, f"raw-{uuid.uuid4().hex}", queue, 0, args)
    producer = Producer(client.settings.kafka_config())
    producer.produce(names.commands(client.settings.namespace), body, key=f"{queue}#0".encode(),
                     partition=command_partition(f"{queue}#0", link._engine_partitions))
    assert producer.flush(10) == 0
    props = admin.get_queue_runtime_properties(queue)
    assert (props.active_message_count, props.dead_letter_message_count) == (50, 0)
    rest = receive(client.get_queue_receiver(queue), 50)
    assert sorted(int(m.message_id[1:]) for m in rest) == list(range(50, 100))
    assert all(m.delivery_count == 0 for m in rest)


def test_a_command_carrying_a_policy_is_refused(client: ServiceBusClient,
                                                make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)
    link = client.get_queue_receiver(queue)._link
    reply = call_raw(link, "stats", queue, 0, hw=0,
                     policy={"lock_ms": 1000, "max_delivery": 1})
    assert not reply.ok and reply.error_code == ErrorCode.UNAUTHORIZED
    assert "policy" in reply.error_message


def test_lock_tokens_are_unguessable_and_not_reusable(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)
    send(client, queue, 2)
    receiver = client.get_queue_receiver(queue)
    first, second = receive(receiver, 2)
    tokens = {first.lock_token, second.lock_token}
    assert all(uuid.UUID(t).version == 4 for t in tokens) and len(tokens) == 2
    issued = first.lock_token
    first.lock_token = str(uuid.uuid4())  # forged
    with pytest.raises(MessageLockLostError):
        receiver.complete_message(first)
    first.lock_token = issued
    receiver.abandon_message(first)
    [again] = receive(receiver, 1)
    assert again.sequence_number == first.sequence_number and again.lock_token != issued
    first._settled = False
    with pytest.raises(MessageLockLostError):  # the token of the earlier lock
        receiver.complete_message(first)
    receiver.complete_message(again)
    receiver.complete_message(second)
