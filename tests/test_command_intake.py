"""The engine's reader of its commands partitions (streams.command_intake)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from streams.command_intake import CommandIntake, CommandRecord, large_tail
from tests.helpers import Broker, one_partition_log
from topics.connection import parse_connection_string


class _OffsetsInMemory:
    """A group's committed offsets, kept here (this test assigns nothing)."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    async def committed(self, partitions: list[int]) -> dict[int, int]:
        return {p: self.offsets.get(p, -1) for p in partitions}

    async def commit(self, offsets: dict[int, int]) -> None:
        self.offsets.update(offsets)


def test_a_job_whose_caller_was_cancelled_leaves_the_reader_reading(broker: Broker) -> None:
    """A rebalance cancels an assignment while the reader thread runs it:
    the reader goes on with the next job. (It ended on setting the cancelled
    job's future, and the worker never read a command again: CI on 35e41de,
    a worker of three silent after its first restore.)"""
    settings = parse_connection_string(broker.connection_string(f"t{uuid.uuid4().hex[:8]}"))
    intake = CommandIntake(settings, f"commands-{uuid.uuid4().hex[:6]}", _OffsetsInMemory(), 10)
    running, release = threading.Event(), threading.Event()

    def assignment_cut_short() -> str:
        running.set()
        release.wait(10)
        return "done, but nobody waits"

    async def scenario() -> int:
        waiting = asyncio.ensure_future(intake._in_reader(assignment_cut_short))
        assert await asyncio.to_thread(running.wait, 10)
        waiting.cancel()
        await asyncio.sleep(0)  # the cancellation reaches the job's future
        release.set()
        return await asyncio.wait_for(intake._in_reader(lambda: 42), 10)

    try:
        assert asyncio.run(scenario()) == 42
    finally:
        intake.close()


def test_records_nobody_waits_for_are_handed_over_together_and_a_waited_one_ends_the_wait(
        broker: Broker) -> None:
    """Records that may wait (settlements final once appended) are held up
    to the least linger of those read so that more join them; one that
    someone waits for is handed over at once, with those held before it,
    in order."""
    settings = parse_connection_string(broker.connection_string(f"t{uuid.uuid4().hex[:8]}"))
    topic = f"commands-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(settings.kafka_config())
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    producer = Producer(settings.kafka_config())
    linger, short = 3.0, 0.6

    def linger_of(record: CommandRecord) -> float:
        value = record.value or b""
        return linger if value.startswith(b"quiet") else short if value.startswith(b"short") \
            else 0.0

    intake = CommandIntake(settings, topic, _OffsetsInMemory(), 100, linger=linger_of)

    def append(value: bytes) -> None:
        producer.produce(topic, value, partition=0)
        producer.flush(10)

    async def scenario() -> list[tuple[list[bytes], float]]:
        await intake.assign({0})
        got = []
        for values in ([b"quiet-1", b"quiet-2", b"answer-me"], [b"answer-me-too"],
                       [b"quiet-3", b"short-1"]):
            batch = asyncio.ensure_future(intake.next_batch())
            started = time.monotonic()
            for value in values:
                await asyncio.to_thread(append, value)
                await asyncio.sleep(0.2)
            records = await asyncio.wait_for(batch, 10)
            got.append(([r.value or b"" for r in records], time.monotonic() - started))
        return got

    try:
        (first, first_s), (second, second_s), (third, third_s) = asyncio.run(scenario())
    finally:
        intake.close()
    assert first == [b"quiet-1", b"quiet-2", b"answer-me"]
    # the waited-for record ended the linger: well before its 3 s
    assert first_s < linger - 1, first_s
    assert second == [b"answer-me-too"] and second_s < 1.0, second_s
    # the shorter linger of a record read later ends the wait of the first:
    # both handed over together, about 0.6 s after the first was read
    assert third == [b"quiet-3", b"short-1"], third
    assert short - 0.1 < third_s < linger - 1, third_s


def test_a_large_tail_nobody_waits_for_is_split_off_to_run_after_the_answers() -> None:
    """The engine applies the settlements nobody waits for that end a batch
    after the batch's answers, if they are large; small ones, and those in
    front of a command somebody waits for, stay in the batch, in order."""
    def records(*values: bytes) -> list[CommandRecord]:
        return [CommandRecord(0, offset, b"q#0", value, 0, True)
                for offset, value in enumerate(values)]

    def split(*values: bytes) -> tuple[list[bytes], list[bytes]]:
        first, second = large_tail(records(*values), lambda r: (r.value or b"")[:1] == b"q", 10)
        return [r.value or b"" for r in first], [r.value or b"" for r in second]

    assert split(b"acquire", b"q-settle-1", b"q-settle-2") == (
        [b"acquire"], [b"q-settle-1", b"q-settle-2"])
    assert split(b"acquire", b"q-s") == ([b"acquire", b"q-s"], [])  # small: stays
    assert split(b"q-settle-1", b"acquire") == ([b"q-settle-1", b"acquire"], [])  # in front
    assert split(b"q-settle-1") == ([], [b"q-settle-1"])
    assert split(b"acquire", b"q-settle-1", b"answer", b"q-s") == (
        [b"acquire", b"q-settle-1", b"answer", b"q-s"], [])


def test_records_held_back_are_applied_only_where_they_will_not_be_read_again(
        broker: Broker) -> None:
    """Records handed out and held back (the engine applies a large tail
    nobody waits for after the batch's answers) are applied after a
    rebalance only for partitions still read from past them: not for a
    partition given up (its new owner's), nor for one assigned anew (read
    again from where it was applied up to)."""
    settings, topic, append = one_partition_log(broker)
    append(3)
    intake = CommandIntake(settings, topic, _OffsetsInMemory(), 100)

    async def scenario() -> tuple[list[int], list[int], list[int], list[int]]:
        await intake.assign({0})
        records: list[CommandRecord] = []
        while len(records) < 3:
            records += await asyncio.wait_for(intake.next_batch(), 10)
        kept = [r.offset for r in intake.not_read_again(records)]
        intake.applied(records[:1])
        await intake.revoke({0})  # commits offset 1
        given_up = [r.offset for r in intake.not_read_again(records)]
        await intake.assign({0})
        assigned_anew = [r.offset for r in intake.not_read_again(records)]
        again = await asyncio.wait_for(intake.next_batch(), 10)
        return kept, given_up, assigned_anew, [r.offset for r in again]

    try:
        kept, given_up, assigned_anew, read_again = asyncio.run(scenario())
    finally:
        intake.close()
    assert kept == [0, 1, 2]
    assert given_up == []
    assert assigned_anew == [0]
    assert read_again == [1, 2]  # from the committed offset 1
