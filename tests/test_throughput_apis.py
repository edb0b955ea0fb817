"""Batch settlement and the processor keep per-message answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from settlement import (
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
)
from settlement.exceptions import MessageLockLostError
from tests.helpers import read_all
from topics import names
from topics.commands import Op


def send(client: ServiceBusClient, queue: str, count: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                              for i in range(count)])


def receive_all(receiver: Any, count: int) -> list[ServiceBusReceivedMessage]:
    """Exactly ``count`` messages, in as many receives as it takes."""
    messages: list[ServiceBusReceivedMessage] = []
    while len(messages) < count:
        messages += receiver.receive_messages(count - len(messages), max_wait_time=10)
    return messages


def test_complete_messages_answers_each_message(client: ServiceBusClient,
                                                make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    send(client, queue, 2)
    receiver = client.get_queue_receiver(queue)
    stale = receiver.receive_messages(1, max_wait_time=10)
    time.sleep(1.5)  # the first message's lock lapses
    fresh = receiver.receive_messages(2, max_wait_time=10)
    assert {m.message_id for m in fresh} == {"m0", "m1"}
    results = receiver.complete_messages(stale + fresh)
    assert [r.succeeded for r in results] == [False, True, True]
    assert isinstance(results[0].error, MessageLockLostError)


def test_process_runs_handlers_concurrently_and_settles_in_batches(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=10)
    send(client, queue, 200)
    receiver = client.get_queue_receiver(queue)
    active, peak, seen = [0], [0], []
    lock = threading.Lock()

    def handler(message: ServiceBusReceivedMessage) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            seen.append((message.message_id, message.delivery_count))
        time.sleep(0.002)
        with lock:
            active[0] -= 1
        if message.message_id.endswith("7") and message.delivery_count == 0:
            raise RuntimeError("first attempt fails")

    stats = receiver.process(handler, max_concurrent_calls=4, batch_size=50, max_wait_time=2)
    assert stats["completed"] == 200 and stats["abandoned"] == 20 and stats["lock_lost"] == 0
    assert 1 < peak[0] <= 4
    retried = {m for m, count in seen if count == 1}
    assert retried == {f"m{i}" for i in range(200) if i % 10 == 7}


def test_process_leaves_alone_what_the_handler_settled_itself(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=10)
    send(client, queue, 90)
    receiver = client.get_queue_receiver(queue)

    def handler(message: ServiceBusReceivedMessage) -> None:
        kind = int(message.message_id[1:]) % 3
        if kind == 0:
            receiver.complete_message(message)
        elif kind == 1:
            receiver.dead_letter_message(message, reason="odd")
        # kind 2: returns, and the processor completes it

    stats = receiver.process(handler, max_concurrent_calls=32, max_wait_time=2)
    assert stats["received"] == 90 and stats["settled_by_handler"] == 60
    assert stats["completed"] == 30 and stats["abandoned"] == stats["lock_lost"] == 0
    dead = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert sorted(int(m.message_id[1:]) for m in receive_all(dead, 30)) == list(range(1, 90, 3))
    assert client.get_queue_receiver(queue).receive_messages(1, max_wait_time=0.5) == []


def test_auto_lock_renewer_keeps_a_lock_past_its_duration(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2)
    send(client, queue, 1)
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    with AutoLockRenewer(max_lock_renewal_duration=30) as renewer:
        renewer.register(receiver, message)
        time.sleep(5)
        other = client.get_queue_receiver(queue)
        assert other.receive_messages(1, max_wait_time=0.5) == []
        receiver.complete_message(message)


def test_auto_lock_renewer_renews_a_partitions_locks_in_one_command_per_round(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2, partition_count=1)
    send(client, queue, 100)
    receiver = client.get_queue_receiver(queue)
    messages = receive_all(receiver, 100)
    batcher = client._settle_batcher()
    with AutoLockRenewer(max_lock_renewal_duration=30) as renewer:
        before = batcher.commands_sent
        for message in messages:
            renewer.register(receiver, message)
        time.sleep(4.5)  # two lock durations: every lock renewed about twice
        renewals = batcher.commands_sent - before
        assert client.get_queue_receiver(queue).receive_messages(1, max_wait_time=0.5) == []
        assert all(r.succeeded for r in receiver.complete_messages(messages))
    # ~4 rounds of one command each; a loaded machine splits a round or two
    # (receive_all locked the 100 in a few batches). One per lock would be 200.
    assert 2 <= renewals <= 10, f"{renewals} renew commands for 100 locks over ~4 rounds"


def test_concurrent_single_settles_share_engine_commands(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """complete_message from many threads: each call gets its own answer, and
    calls that overlap travel in one command (group commit), which gathers
    the threads coming back from the command before."""
    queue = make_queue(lock_duration=30)
    send(client, queue, 240)
    receiver = client.get_queue_receiver(queue)
    messages = receive_all(receiver, 240)
    batcher = client._settle_batcher()
    before = batcher.commands_sent
    failures: list[Exception] = []

    def settle(chunk: list[ServiceBusReceivedMessage]) -> None:
        for message in chunk:
            try:
                receiver.complete_message(message)
            except Exception as exc:  # collected and asserted below
                failures.append(exc)

    threads = [threading.Thread(target=settle, args=(messages[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert all(m._settled for m in messages)
    # a leader waits for the threads answered a moment ago (7.5 a command
    # here, idle; 3.9 in make bench before it did)
    commands = batcher.commands_sent - before
    assert commands < 240 / 4, f"{commands} commands for 240 settlements from 8 threads"
    with pytest.raises(MessageLockLostError):
        stale = messages[0]
        stale._settled = False  # pretend the app lost track: the engine still refuses
        receiver.complete_message(stale)


def test_receiver_loop_releases_what_it_locked_ahead_but_did_not_hand_out(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """A tight ``for message in receiver`` loop locks messages ahead of the
    application; when it ends early, those go back at once, their delivery
    count untouched."""
    queue = make_queue(lock_duration=30)
    send(client, queue, 50)
    receiver = client.get_queue_receiver(queue, max_wait_time=5)
    seen: list[ServiceBusReceivedMessage] = []
    for message in receiver:
        receiver.complete_message(message)
        seen.append(message)
        if len(seen) == 10:
            break
    rest: list[ServiceBusReceivedMessage] = []
    other = client.get_queue_receiver(queue)
    while len(rest) < 40:
        got = other.receive_messages(40 - len(rest), max_wait_time=5)
        assert got, f"only {len(rest)} of the 40 others came back"
        rest += got
    assert [m.delivery_count for m in rest] == [0] * 40
    assert {m.message_id for m in seen + rest} == {f"m{i}" for i in range(50)}


def test_a_prefetching_receiver_locks_the_next_batch_before_the_application_settles_this_one(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """``receive_messages(100)`` on a receiver with ``prefetch_count=100``
    that comes back full asks for the next batch before it returns: that
    acquire is in the commands log ahead of the batch's settlement (the
    engine locks the next batch first, and the next receive finds it
    sooner). Every message is handed out once; the batch read ahead and
    never taken goes back when the receiver closes, its delivery count
    untouched."""
    queue = make_queue(lock_duration=30, partition_count=1)
    send(client, queue, 250)
    with client.get_queue_receiver(queue, prefetch_count=100) as receiver:
        taken = []
        for _ in range(2):
            batch = receiver.receive_messages(100, max_wait_time=10)
            assert len(batch) == 100
            assert all(r.succeeded for r in receiver.complete_messages(batch))
            taken += batch
    rest = receive_all(client.get_queue_receiver(queue), 50)
    assert [m.delivery_count for m in rest] == [0] * 50
    assert sorted(m.message_id for m in taken + rest) == sorted(f"m{i}" for i in range(250))
    commands = read_all(client, names.commands(client.settings.namespace), f"{queue}#0".encode(),
                        lambda found: len(found) >= 6)
    # a settlement's items: its messages of one acquire travel as one group
    ops = [(c["op"], sum(len(i["offsets"]) if isinstance(i, dict) else 1
                         for i in c.get("items", [])))
           for c in commands if c["op"] in (Op.ACQUIRE, Op.SETTLE)]
    # acquire 100, the next 100 read ahead, settle the first; the last 50 read
    # ahead, settle the second; release the 50 (then the other receiver's)
    assert ops[:6] == [("acquire", 0), ("acquire", 0), ("settle", 100), ("acquire", 0),
                       ("settle", 100), ("settle", 50)], ops
