"""topics.offsets.GapGuard on a real broker: a consumer that was handed
records past some not read yet reads those again, in order (what Tansu's
fetches need), and reads on past a gap that holds nothing once it waited."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.helpers import Broker, one_partition_log
from topics import offsets
from topics.connection import ConnectionSettings
from topics.offsets import GapGuard, offset_of, take


@contextmanager
def _assigned(settings: ConnectionSettings, topic: str, offset: int) -> Iterator[Consumer]:
    consumer = Consumer(settings.consumer_config("gap-guard"))
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        yield consumer
    finally:
        consumer.close()


def _read(consumer: Consumer, guard: GapGuard, count: int, timeout: float = 20.0
          ) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += guard.admit(consumer, take(consumer, count - len(got), 0.1))
    return got


@pytest.mark.tansu
@pytest.mark.parametrize(("enabled", "expected"), [(True, range(10)), (False, range(4, 10))],
                         ids=["enabled", "not-enabled"])
def test_records_met_past_the_next_offset_are_held_and_the_gap_read_again(
        broker: Broker, enabled: bool, expected: range) -> None:
    """The consumer starts at offset 4, as if the broker had answered its
    fetch at 0 with a later batch; the guard expects 0: enabled (Tansu's
    profile), it holds 4.. back, seeks to 0, and hands out 0..9 in order,
    each once; not enabled (Apache Kafka's), records pass as they come."""
    settings, topic, append = one_partition_log(broker)
    append(10)
    with _assigned(settings, topic, 4) as consumer:
        guard = GapGuard(topic, enabled=enabled, start=[TopicPartition(topic, 0, 0)])
        got = _read(consumer, guard, len(expected))
        assert [offset_of(r) for r in got] == list(expected)
        assert [r.value() for r in got] == [f"record {i}".encode() for i in expected]


def test_a_gap_that_holds_nothing_is_read_past_after_the_wait(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets 0-3 deleted (Apache Kafka's DeleteRecords): the guard reads
    the gap again until GAP_WAIT_S passed, then hands out 4..9."""
    monkeypatch.setattr(offsets, "GAP_WAIT_S", 0.5)
    settings, topic, append = one_partition_log(broker)
    append(10)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)
    with _assigned(settings, topic, 0) as consumer:
        guard = GapGuard(topic, enabled=True, start=[TopicPartition(topic, 0, 0)])
        started = time.monotonic()
        got = _read(consumer, guard, 6)
        assert [offset_of(r) for r in got] == list(range(4, 10))
        assert time.monotonic() - started >= 0.5
