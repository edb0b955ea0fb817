"""Engine state that scales with what is in flight, not with what a queue holds.

Before the window was split into bounded keys, one JSON value held all of a
partition's state: at 20,000 dead letters its changelog record passed 1 MB
and the worker died. Answers to commands are kept by command id for minutes,
not the last 64, and a command whose state cannot be stored is refused
while the worker goes on serving.
"""

from __future__ import annotations

from collections.abc import Callable

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from settlement._engine_link import EngineLink
from settlement.management import ServiceBusAdministrationClient
from streams.process import EngineProcess
from topics.commands import AcquireArgs, Action, SettleArgs, SettleItem
from topics.connection import parse_connection_string

DEAD = 30_000
BATCH = 1_000


def _receive_all(receiver: ServiceBusReceiver, want: int,
                 settle: Callable[[list[ServiceBusReceivedMessage]], None]) -> int:
    done = 0
    while done < want:
        batch = receiver.receive_messages(BATCH, max_wait_time=5)
        assert batch, f"the queue ran dry after {done} of {want} messages"
        settle(batch)
        done += len(batch)
    return done


def test_30000_dead_letters_keep_serving_and_drain_completely(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str], engine: EngineProcess) -> None:
    queue = make_queue(partition_count=1, lock_duration=60)
    with client.get_queue_sender(queue) as sender:
        for first in range(0, DEAD, 5_000):
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(first, first + 5_000)])
    with client.get_queue_receiver(queue) as receiver:
        def dead_letter(batch: list) -> None:
            results = receiver.settle_messages(batch, "dead_letter", "Poison", "cannot parse")
            assert all(r.succeeded for r in results)

        _receive_all(receiver, DEAD, dead_letter)
        assert admin.get_queue_runtime_properties(queue).dead_letter_message_count == DEAD

        # The queue goes on serving with all of them parked.
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"new{i}") for i in range(10)])
        fresh = receiver.receive_messages(10, max_wait_time=10)
        assert sorted(str(m) for m in fresh) == sorted(f"new{i}" for i in range(10))
        for message in fresh:
            receiver.complete_message(message)

    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        def complete(batch: list) -> None:
            assert all(m.dead_letter_reason == "Poison" for m in batch)
            assert all(r.succeeded for r in dlq.complete_messages(batch))

        assert _receive_all(dlq, DEAD, complete) == DEAD
        assert dlq.receive_messages(10, max_wait_time=1) == []
    props = admin.get_queue_runtime_properties(queue)
    assert (props.dead_letter_message_count, props.active_message_count) == (0, 0)
    assert engine.pid  # the same worker served it all


def test_retried_commands_after_500_others_are_answered_not_applied_again(
        conn: str, client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(partition_count=1, lock_duration=60)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    link = EngineLink(parse_connection_string(conn))
    try:
        acquire = link.command(queue, 0, AcquireArgs("active", "peek_lock", 1, 3))
        granted = link.call(acquire).grants
        assert [g.offset for g in granted] == [0]
        complete = link.command(queue, 0, SettleArgs((
            SettleItem(0, granted[0].lock_token, Action.COMPLETE),)))
        assert list(link.call(complete).statuses) == [("ok", 0)]

        forged = SettleItem(2, "00000000-0000-0000-0000-000000000000", Action.COMPLETE)
        others = [link.command(queue, 0, SettleArgs((forged,))) for _ in range(500)]
        assert {next(r.statuses)[0] for r in link.call_many(others)} == {"lock_lost"}

        again = link.call(acquire)  # the same command id: the same answer
        assert again.ok and again.grants == []  # its one lock was settled since
        assert list(link.call(complete).statuses) == [("ok", 0)]  # not "lock_lost"
        fresh = link.call(link.command(
            queue, 0, AcquireArgs("active", "peek_lock", 5, 3))).grants
        assert [g.offset for g in fresh] == [1, 2], "the retried acquire took a message again"
    finally:
        link.close()


def test_state_too_large_to_store_is_refused_and_the_worker_goes_on(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(partition_count=1, lock_duration=60)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(100)])
    # The longest reason and description a command accepts, for 100 messages
    # in one command (800 KB, under the 1 MB a record may be): more than the
    # engine writes at once. The client never sends that (it splits long
    # texts over smaller commands), so it is sent here as another client
    # might.
    reason, description = "r" * 4_000, "x" * 4_000
    with client.get_queue_receiver(queue) as receiver:
        messages: list[ServiceBusReceivedMessage] = []
        while len(messages) < 100:
            messages += receiver.receive_messages(100 - len(messages), max_wait_time=5)
        link = EngineLink(client.settings)
        try:
            reply = link.call(link.command(queue, 0, SettleArgs(tuple(
                SettleItem(m.offset, m.lock_token, Action.DEAD_LETTER, reason,
                           description) for m in messages))))
        finally:
            link.close()
        assert not reply.ok and reply.error_code == "StateTooLarge", reply
        assert "fewer messages" in reply.error_message
        receiver.complete_messages(messages)  # refused before anything changed: locks held
    props = admin.get_queue_runtime_properties(queue)
    assert props.dead_letter_message_count == 0
    assert props.active_message_count == 0
    other = f"{queue}-after"
    admin.create_queue(other)
    try:
        with client.get_queue_sender(other) as sender:
            sender.send_messages(ServiceBusMessage("still here"))
        with client.get_queue_receiver(other) as receiver:
            got = receiver.receive_messages(1, max_wait_time=10)
            assert [str(m) for m in got] == ["still here"]
            receiver.complete_message(got[0])
    finally:
        admin.delete_queue(other)

