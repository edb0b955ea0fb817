"""The client's readers of an entity's log (settlement._log_reader), on a
real broker."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from settlement import _log_reader
from settlement._log_reader import Kept, ReaderPool
from tests.helpers import Broker, one_partition_log


def test_readers_of_one_partition_reading_scattered_offsets_side_by_side_each_get_theirs(
        broker: Broker) -> None:
    """The receivers of a topic's subscriptions each read every Nth record of
    one log at once: one reads at a time and the others take what it read
    past. Each gets its own records, every one, whatever the order."""
    settings, topic, append = one_partition_log(broker)
    records, readers = 6_000, 5
    append(records)

    pool = ReaderPool(settings)
    got: dict[int, dict[int, Message | None]] = {}
    errors: list[BaseException] = []

    def read(k: int) -> None:
        reader = pool.take(topic, 0)
        try:
            # two reads each, as a receiver's two batches
            mine = list(range(k, records, readers))
            half = len(mine) // 2
            got[k] = {**reader.read(mine[:half]), **reader.read(mine[half:])}
        except BaseException as exc:
            errors.append(exc)
        finally:
            pool.give_back(reader)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(readers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        for k in range(readers):
            values = {o: (r.value() if r is not None else None) for o, r in got[k].items()}
            assert values == {o: f"record {o}".encode() for o in range(k, records, readers)}
    finally:
        pool.close()


def test_a_reader_seeking_to_scattered_offsets_reads_the_stride_before_them_for_its_neighbours(
        broker: Broker) -> None:
    """A reader that seeks to every tenth record from the fourth on starts a
    stride early and keeps what it reads past: the reader of every tenth from
    the first finds all of its records kept, and its consumer never moves."""
    settings, topic, append = one_partition_log(broker)
    records = 1_000
    append(records)
    pool = ReaderPool(settings)
    first, second = pool.take(topic, 0), pool.take(topic, 0)
    try:
        at_end = second._position
        for reader, start in ((first, 3), (second, 0)):
            got = reader.read(list(range(start, records, 10)))
            assert {o: r.value() if r is not None else None for o, r in got.items()} == {
                o: f"record {o}".encode() for o in range(start, records, 10)}
        assert second._position == at_end
    finally:
        pool.give_back(first)
        pool.give_back(second)
        pool.close()


def test_a_reader_draining_its_fetch_queue_fast_finds_the_next_records_fetched(
        broker: Broker) -> None:
    """A receiver of 1,000 at a time empties its reader's fetch queue (16 MB,
    filled while it waited for the engine) in a fraction of a second:
    librdkafka then fetches again at once, not a second later
    (``fetch.queue.backoff.ms``'s default: make bench's receive of the batch
    after the queue was full waited 460-600 ms for it)."""
    settings, topic, _ = one_partition_log(broker)
    records, size, batch = 8_000, 4096, 500
    producer = Producer(settings.kafka_config())
    for i in range(records):
        producer.produce(topic, f"record {i}".encode().ljust(size, b"."))
        producer.poll(0)
    assert producer.flush(60) == 0

    pool = ReaderPool(settings)
    reader = pool.take(topic, 0)
    try:
        slowest = 0.0
        for first in range(0, records, batch):
            started = time.monotonic()
            got = reader.read(list(range(first, first + batch)))
            if first:  # the first read seeks back from the log end
                slowest = max(slowest, time.monotonic() - started)
            assert [r.value()[:12] for r in got.values() if r is not None] == [
                f"record {o}".encode().ljust(12, b".") for o in range(first, first + batch)]
            # as a receiver waits for the engine's next grants: its consumer
            # fetches ahead meanwhile, the first time until its queue is full
            time.sleep(0.2 if not first else 0.02)
        assert slowest < 0.3, f"a read of {batch} records ({batch * size / 2**20:.0f} MB) " \
                              f"took {slowest:.2f} s"
    finally:
        pool.give_back(reader)
        pool.close()


def test_a_new_reader_fetches_from_where_the_engine_trims_the_log_to(broker: Broker) -> None:
    """Where the broker trims logs (DeleteRecords, Apache Kafka), the engine
    trims an entity's log up to the oldest offset it may still hand out: a
    new reader's consumer fetches from the log start, so the records the
    first grants most likely name are at hand before they are asked for (a
    topic's ten subscriptions sought there from the log end and waited 20-45
    ms for them)."""
    settings, topic, append = one_partition_log(broker)
    records, trimmed = 2_000, 500
    append(records)
    assert settings.profile.deletes_records
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    [done] = admin.delete_records([TopicPartition(topic, 0, trimmed)]).values()
    done.result(30)

    pool = ReaderPool(settings)
    reader = pool.take(topic, 0)
    try:
        deadline = time.monotonic() + 10
        found: dict[int, Message] = {}
        while not found and time.monotonic() < deadline:
            found = reader.at_hand(range(0, records))  # only what it fetched, never waited for
            time.sleep(0.01)
        assert min(found) == trimmed
    finally:
        pool.give_back(reader)
        pool.close()


def test_the_receivers_of_a_topics_subscriptions_share_one_reader_that_keeps_what_each_read(
        broker: Broker) -> None:
    """Readers taken ``shared`` (a topic's subscriptions) are one reader, one
    consumer, until the last gives it back; a record one of them read stays
    kept for the next that wants it (``all`` after ``low``), without a
    seek back. Not shared (a queue's receivers), each gets its own."""
    settings, topic, append = one_partition_log(broker)
    records = 400
    append(records)
    pool = ReaderPool(settings)
    low, everything = pool.take(topic, 0, shared=True), pool.take(topic, 0, shared=True)
    alone = pool.take(topic, 0)
    try:
        assert low is everything and alone is not low
        evens = list(range(0, records, 2))
        assert [r.value() for r in low.read(evens).values() if r is not None] == [
            f"record {o}".encode() for o in evens]
        sought: list[int] = []
        seek = everything._seek
        everything._seek = lambda offset: (sought.append(offset), seek(offset))[1]  # type: ignore[method-assign]
        got = everything.read(list(range(records)))
        assert [(o, r.value() if r is not None else None) for o, r in sorted(got.items())] == [
            (o, f"record {o}".encode()) for o in range(records)]
        assert sought == []  # what low read was kept for it: no seek back
    finally:
        pool.give_back(low)
        pool.give_back(alone)
        assert pool.take(topic, 0, shared=True) is everything  # still shared with one user
        pool.give_back(everything)
        pool.give_back(everything)
        pool.close()


def test_receivers_taking_a_shared_reader_at_once_get_one_and_leave_no_other_consumer(
        broker: Broker) -> None:
    """Subscriptions' receivers opened side by side each start a reader (a
    new consumer takes 10-50 ms to learn the log's end); they all get the
    one shared, and the readers made meanwhile are closed, not left idle."""
    settings, topic, append = one_partition_log(broker)
    append(10)
    pool = ReaderPool(settings)
    got: list[_log_reader.PartitionReader] = []
    start = threading.Barrier(4)

    def take() -> None:
        start.wait()
        got.append(pool.take(topic, 0, shared=True))

    threads = [threading.Thread(target=take) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(got) == 4 and len({id(r) for r in got}) == 1
        for reader in got:
            pool.give_back(reader)
        assert pool._idle == [got[0]]
        assert pool._readers == {(topic, 0): 1}
    finally:
        pool.close()


def test_receivers_sharing_a_reader_give_it_back_after_their_client_closed(
        broker: Broker) -> None:
    """A client closed before its subscriptions' receivers: each receiver
    still gives the shared reader back, and the last one closes it."""
    settings, topic, append = one_partition_log(broker)
    append(10)
    pool = ReaderPool(settings)
    readers = [pool.take(topic, 0, shared=True) for _ in range(3)]
    assert len({id(r) for r in readers}) == 1
    pool.close()
    for reader in readers:
        pool.give_back(reader)
    assert pool._shared == {}
    with pytest.raises(RuntimeError):  # its consumer is closed
        readers[0]._consumer.assignment()


def test_a_pool_closed_with_its_client_pools_readers_again_once_the_client_is_used_again(
        broker: Broker) -> None:
    """As in the SDK, a client may be used again after close: the receivers
    it makes then give their readers back to wait for the next one, as
    before the close, rather than closing them."""
    settings, topic, append = one_partition_log(broker)
    append(10)
    pool = ReaderPool(settings)
    try:
        pool.give_back(pool.take(topic, 0))
        pool.close()
        assert pool._idle == []
        reader = pool.take(topic, 0)
        assert set(reader.read([3])) == {3}
        pool.give_back(reader)
        assert pool._idle == [reader]
        again = pool.take(topic, 0)
        assert again is reader
        pool.give_back(again)
    finally:
        pool.close()


def test_what_the_readers_of_a_partition_kept_goes_once_none_of_them_was_used_a_while(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle readers wait for the next receiver; what they read past stays
    for it while it comes soon (the next session of a queue, read past by
    the last), and goes once none of the partition's readers was used for
    KEEP_IDLE_S (bench-topics' client held every record of each topic it
    had drained, walked by every full garbage collection). While a receiver
    of the partition still reads, the keep stays for it."""
    monkeypatch.setattr(_log_reader, "KEEP_IDLE_S", 0.3)
    settings, topic, append = one_partition_log(broker)
    records = 200
    append(records)
    odd = range(1, records, 2)
    pool = ReaderPool(settings)
    try:
        first, second = pool.take(topic, 0), pool.take(topic, 0)
        assert set(first.read(list(range(0, records, 2)))) == set(range(0, records, 2))
        kept = pool._kept[(topic, 0)]
        assert set(kept.peek(range(records))) == set(odd)  # read past, for the others
        pool.give_back(first)
        assert set(kept.peek(range(records))) == set(odd)  # second may want them
        pool.give_back(second)
        assert set(kept.peek(range(records))) == set(odd)  # the next receiver's, if it comes
        time.sleep(0.4)
        pool.give_back(pool.take(topic, 0))
        assert kept.peek(range(records)) == {}

        _, log_topic, append_to_log = one_partition_log(broker)  # a topic's log
        append_to_log(records)
        shared = pool.take(log_topic, 0, shared=True)
        fanned = pool._kept[(log_topic, 0)]
        assert fanned.fan_out
        assert set(shared.read(list(odd))) == set(odd)
        assert fanned.peek(range(records))  # what it read, for each subscription
        pool.give_back(shared)
        time.sleep(0.4)
        pool.give_back(pool.take(topic, 0))  # any reader's comings and goings
        assert fanned.peek(range(records)) == {}
    finally:
        pool.close()


def _records(offsets: range) -> list[tuple[int, Message]]:
    return [(o, Message(topic="t", partition=0, offset=o, value=f"record {o:04}".encode()))
            for o in offsets]


def test_records_a_reader_reads_through_again_are_not_kept_again() -> None:
    """Receivers competing for a partition read past each other's grants: a
    reader whose consumer is behind reads through records another read
    before, kept then or taken since. Kept again, a taken one would be a copy
    for nobody (make bench's client held 18,000 of them by its asyncio phase)."""
    kept = Kept()
    kept.keep(_records(range(10, 100)), range(0, 100))  # a read of 0-9 read past 10-99
    assert set(kept.take(list(range(10, 50)))) == set(range(10, 50))  # another's grants
    kept.keep([], range(500, 500))  # a reader that sought away and read nothing yet
    # a reader behind reads through 0-119 for its grants 120-149
    kept.keep(_records(range(0, 120)), range(0, 150))
    assert set(kept.peek(range(0, 200))) == set(range(50, 120))


def test_records_gone_from_the_keep_are_kept_again_when_read_through_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its bound the keep lets its oldest records go: a read through
    them again keeps them again, for the readers that still want them."""
    monkeypatch.setattr(_log_reader, "_AHEAD_BYTES", 50 * len(b"record 0100"))
    kept = Kept()
    kept.keep(_records(range(0, 100)), range(0, 100))
    assert set(kept.peek(range(0, 100))) == set(range(50, 100))
    kept.keep(_records(range(0, 10)), range(0, 10))
    assert set(kept.peek(range(0, 10))) == set(range(0, 10))


def test_a_topics_keep_grows_with_the_subscriptions_reading_it_side_by_side(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic's keep holds a receive's worth per receiver sharing its
    reader, up to the bound of any keep: ten subscriptions drifting apart
    read a 20 MB log 2-3 times over in 16 MB. One subscription alone keeps
    no more than before, and the bound shrinks again as receivers leave."""
    size = len(b"record 0100")
    monkeypatch.setattr(_log_reader, "_FAN_OUT_BYTES", 10 * size)
    monkeypatch.setattr(_log_reader, "_AHEAD_BYTES", 40 * size)
    kept = Kept(fan_out=True)
    kept.keep(_records(range(0, 100)), range(0, 100))
    assert set(kept.peek(range(0, 100))) == set(range(90, 100))
    kept.shared_by(3)
    kept.keep(_records(range(100, 200)), range(100, 200))
    assert set(kept.peek(range(0, 200))) == set(range(170, 200))
    kept.shared_by(10)  # no more than any keep
    kept.keep(_records(range(200, 300)), range(200, 300))
    assert set(kept.peek(range(0, 300))) == set(range(260, 300))
    kept.shared_by(1)
    assert set(kept.peek(range(0, 300))) == set(range(290, 300))
    queue = Kept()  # a queue's keep: bounded the same however many read it
    queue.shared_by(1)
    queue.keep(_records(range(0, 100)), range(0, 100))
    assert set(queue.peek(range(0, 100))) == set(range(60, 100))
