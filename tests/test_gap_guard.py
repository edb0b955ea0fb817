"""topics.offsets.GapGuard on a real broker: a consumer that was handed
records past some not read yet reads those again, in order (what Tansu's
fetches need), and reads on past a gap that holds nothing once it waited."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.helpers import Broker, one_partition_log
from topics import offsets
from topics.offsets import GapGuard, offset_of, take


def _read(consumer: Consumer, guard: GapGuard, count: int, timeout: float = 20.0
          ) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += guard.admit(consumer, take(consumer, count - len(got), 0.1))
    return got


@pytest.mark.tansu
def test_records_met_past_the_next_offset_are_held_and_the_gap_read_again(
        broker: Broker) -> None:
    """The consumer starts at offset 4, as if the broker had answered its
    fetch at 0 with a later batch; the guard expects 0: it holds 4.. back,
    seeks to 0, and hands out 0..9 in order, each once."""
    settings, topic, append = one_partition_log(broker)
    append(10)
    consumer = Consumer(settings.consumer_config("gap-guard"))
    try:
        consumer.assign([TopicPartition(topic, 0, 4)])
        guard = GapGuard(topic, enabled=True)
        guard.moved([TopicPartition(topic, 0, 0)])
        got = _read(consumer, guard, 10)
        assert [offset_of(r) for r in got] == list(range(10))
        assert [r.value() for r in got] == [f"record {i}".encode() for i in range(10)]
    finally:
        consumer.close()


def test_a_gap_that_holds_nothing_is_read_past_after_the_wait(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets 0-3 deleted (Apache Kafka's DeleteRecords): the guard reads
    the gap again until GAP_WAIT_S passed, then hands out 4..9."""
    monkeypatch.setattr(offsets, "GAP_WAIT_S", 0.5)
    settings, topic, append = one_partition_log(broker)
    append(10)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    deleted = admin.delete_records([TopicPartition(topic, 0, 4)])
    for future in deleted.values():
        future.result(30)
    consumer = Consumer(settings.consumer_config("gap-guard"))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        guard = GapGuard(topic, enabled=True)
        guard.moved([TopicPartition(topic, 0, 0)])
        started = time.monotonic()
        got = _read(consumer, guard, 6)
        assert [offset_of(r) for r in got] == list(range(4, 10))
        assert time.monotonic() - started >= 0.5
    finally:
        consumer.close()


def test_a_guard_not_enabled_hands_out_what_the_consumer_read(broker: Broker) -> None:
    """Apache Kafka's profile: records pass as they come, the gap unread."""
    settings, topic, append = one_partition_log(broker)
    append(10)
    consumer = Consumer(settings.consumer_config("gap-guard"))
    try:
        consumer.assign([TopicPartition(topic, 0, 4)])
        guard = GapGuard(topic, enabled=False)
        guard.moved([TopicPartition(topic, 0, 0)])
        assert [offset_of(r) for r in _read(consumer, guard, 6)] == list(range(4, 10))
    finally:
        consumer.close()
