"""The engine link's producers (lanes): threads of one client send their
commands through producers of their own, each thread's in the order it
sent them, and the link makes no more producers than it starts with."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from settlement._engine_link import LANES, EngineLink
from topics import names
from topics.commands import AcquireArgs, CommandError, decode_command
from topics.connection import parse_connection_string
from topics.partitions import command_partition

COMMANDS_EACH = 40


def _ids_in_log_order(conn: str, window_key: str, engine_partitions: int,
                      wanted: set[str]) -> list[str]:
    """The ids of ``wanted`` commands in the order the commands topic holds
    them (its partition of ``window_key``), read until all are found."""
    settings = parse_connection_string(conn)
    consumer = Consumer(settings.consumer_config("engine-link-test"))
    topic = names.commands(settings.namespace)
    consumer.assign([TopicPartition(topic, command_partition(window_key, engine_partitions), 0)])
    found: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < len(wanted) and time.monotonic() < deadline:
            for record in consumer.consume(500, timeout=0.5):
                if record.error():
                    continue
                try:
                    cmd_id = decode_command(record.value()).id
                except CommandError:  # another test's bad input
                    continue
                if cmd_id in wanted:
                    found.append(cmd_id)
    finally:
        consumer.close()
    return found


def test_threads_take_the_links_producers_in_turn_and_it_makes_no_more(conn: str) -> None:
    link = EngineLink(parse_connection_string(conn))
    lanes: list[object] = []
    try:
        def take() -> None:
            lanes.append(link._lane())
            assert link._lane() is lanes[-1], "a thread changed producers"

        for _ in range(LANES + 1):
            thread = threading.Thread(target=take)
            thread.start()
            thread.join()
        assert len({id(lane) for lane in lanes[:LANES]}) == LANES
        assert lanes[LANES] is lanes[0]
        assert len(link._lanes) == LANES
    finally:
        link.close()
    with pytest.raises(ValueError, match="closed"):  # no producer taken once closed
        link._lane()


def test_each_threads_commands_reach_the_log_in_the_order_it_sent_them(
        conn: str, make_queue: Callable[..., str]) -> None:
    """Commands sent without waiting for their appends (as a receive's
    read-ahead sends its acquire) from more threads than the link has
    producers: each thread's reach the commands log in its order."""
    queue = make_queue(partition_count=1)
    link = EngineLink(parse_connection_string(conn))
    sent: dict[int, list[str]] = {}
    errors: list[BaseException] = []
    try:
        def send(number: int) -> None:
            try:
                cmds = [link.command(queue, 0, AcquireArgs("active", "peek_lock", 1, 0))
                        for _ in range(COMMANDS_EACH)]
                answers = [link.start_call(cmd) for cmd in cmds]
                sent[number] = [cmd.id for cmd in cmds]
                for answer in answers:
                    assert answer().ok
            except BaseException as exc:  # raised in the test's thread below
                errors.append(exc)

        threads = [threading.Thread(target=send, args=(n,)) for n in range(LANES + 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        window_key = link.command(queue, 0, AcquireArgs("active", "peek_lock", 1, 0)).window_key
        in_log = _ids_in_log_order(conn, window_key, link._engine_partitions,
                                   {i for ids in sent.values() for i in ids})
    finally:
        link.close()
    assert len(in_log) == COMMANDS_EACH * len(threads)
    for number, ids in sent.items():
        mine = set(ids)
        assert [i for i in in_log if i in mine] == ids, f"thread {number}'s commands reordered"
