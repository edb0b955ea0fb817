"""The engine's log scanner (streams.log_scanner) reading one log for
windows that stand at different offsets, as the subscriptions of a topic do,
on a real broker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from streams import log_scanner
from streams.log_scanner import MAX_RECORDS, LogScanner
from tests.helpers import Broker, one_partition_log
from topics.rule_set import RuleSet, RuleSpec


class _CountedMoves:
    """The scanner's consumers of one log, noting where each is moved to
    (``assign``): a consumer moved is a new one where a fetch waits at the
    log end (streams.log_scanner.LogScanner._replace_consumer), and the
    moves of all of them count."""

    def __init__(self, scanner: LogScanner) -> None:
        self.moves: list[int] = []
        self._make = scanner._consumer
        self._scanner = scanner
        scanner._consumer = self._consumer  # type: ignore[method-assign]

    def _consumer(self, tp: tuple[str, int]) -> Consumer:
        consumer = self._make(tp)
        if not isinstance(consumer, _Counted):
            consumer = self._scanner._consumers[tp] = _Counted(  # type: ignore[assignment]
                consumer, self.moves)
        return consumer


class _Counted:
    """A consumer noting where it is moved to in ``moves``."""

    def __init__(self, consumer: Consumer, moves: list[int]) -> None:
        self._consumer = consumer
        self._moves = moves

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._moves.append(partitions[0].offset)
        self._consumer.assign(partitions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _scanner_of_log(broker: Broker, records: int
                    ) -> tuple[LogScanner, tuple[str, int], _CountedMoves, Callable[[int], None]]:
    """A scanner whose consumers are counted, of a new one-partition log of
    ``records`` records, and what appends more records to it."""
    settings, topic, append = one_partition_log(broker)
    append(records)
    scanner = LogScanner(settings, lambda: None)  # type: ignore[arg-type,return-value]
    return scanner, (topic, 0), _CountedMoves(scanner), append


def _read_in_rounds(scanner: LogScanner, tp: tuple[str, int], starts: dict[str, int],
                    end: int) -> dict[str, list[int]]:
    """Each window reads from where it stands, one read a round, as the scan
    timer takes them, until each has read to ``end``: the offsets each got."""
    got: dict[str, list[int]] = {key: [] for key in starts}
    deadline = time.monotonic() + 60
    while any(start < end for start in starts.values()):
        assert time.monotonic() < deadline, f"windows stand at {starts} of {end} after 60 s"
        for key, start in starts.items():
            if start < end:
                offsets = [read.offset for read in scanner._read(key, tp, start)]
                got[key] += offsets
                starts[key] = offsets[-1] + 1 if offsets else start
    return got


def test_windows_apart_share_one_forward_read_of_their_log(broker: Broker) -> None:
    """Windows up to MAX_RECORDS apart are served by one consumer reading the
    log forward, once: it is never moved back for the one behind nor forward
    for the one ahead (each move waits out the fetch parked at the log end,
    500 ms on Apache Kafka: ten subscriptions that had drifted apart took
    turns moving it and drained 10-20 s late). Each window gets every record
    from where it stands, in order, once."""
    records = 6_000
    scanner, tp, consumer, _ = _scanner_of_log(broker, records)
    try:
        starts = {"w0": 0, "w1": 2_400, "w2": 4_800}
        got = _read_in_rounds(scanner, tp, dict(starts), records)
        assert {key: got[key] == list(range(start, records)) for key, start in starts.items()} \
            == {key: True for key in starts}
        assert consumer.moves == [0]
    finally:
        scanner.close()


def test_a_window_behind_the_kept_records_moves_the_consumer_back_once(broker: Broker) -> None:
    """A window behind what the scanner keeps (a subscription created later,
    or one whose accept was refused) moves the consumer back; the windows
    ahead of it then read on through the gap rather than moving it again."""
    records = MAX_RECORDS * 2
    scanner, tp, consumer, _ = _scanner_of_log(broker, records)
    try:
        assert _read_in_rounds(scanner, tp, {"w0": 0}, records)["w0"] == list(range(records))
        starts = {"w1": 100, "w2": 3_000}
        got = _read_in_rounds(scanner, tp, dict(starts), records)
        assert {key: got[key] == list(range(start, records)) for key, start in starts.items()} \
            == {key: True for key in starts}
        assert consumer.moves == [0, 100]
    finally:
        scanner.close()


def test_a_window_behind_is_read_without_waiting_out_the_fetch_parked_at_the_log_end(
        broker: Broker) -> None:
    """The consumer of a log read to its end waits there for new records
    (Apache Kafka holds the fetch up to 500 ms), and a consumer moved waits
    for it: a window behind (a subscription created just before its topic
    was published) moves the scanner to a new consumer instead, and gets its
    first records in a fraction of that (it took 460 ms, and the windows of
    the other subscriptions, ahead of it, waited for it)."""
    records = MAX_RECORDS * 2
    scanner, tp, consumer, _ = _scanner_of_log(broker, records)
    try:
        assert _read_in_rounds(scanner, tp, {"w0": 0}, records)["w0"] == list(range(records))
        time.sleep(0.02)  # its next fetch waits at the log end
        started = time.monotonic()
        behind: list[Any] = []
        while not behind and time.monotonic() - started < 5:
            behind = scanner._read("w1", tp, 100)
        took = time.monotonic() - started
        assert [r.offset for r in behind[:3]] == [100, 101, 102]
        assert consumer.moves == [0, 100]
        assert took < 0.3, f"the window behind waited {took:.2f} s for its first records"
    finally:
        scanner.close()


def test_a_window_that_stops_reading_holds_the_others_back_only_for_a_while(
        broker: Broker, monkeypatch: Any) -> None:
    """Where a window last read stops counting after ``_PLACE_KEPT_S`` (its
    subscription deleted, say): the windows ahead of it then read on."""
    monkeypatch.setattr(log_scanner, "_PLACE_KEPT_S", 0.5)
    scanner, tp, _, append = _scanner_of_log(broker, 1_000)
    try:
        read = _read_in_rounds(scanner, tp, {"gone": 0}, 1)["gone"]  # then never scanned again
        append(1_000)
        ahead = len(read) + 500
        waited = [scanner._read("ahead", tp, ahead) for _ in range(3)]
        assert waited == [[], [], []]  # for the window behind, which drives the consumer
        time.sleep(0.6)
        assert _read_in_rounds(scanner, tp, {"ahead": ahead}, 2_000)["ahead"] \
            == list(range(ahead, 2_000))
    finally:
        scanner.close()


def _record(offset: int, headers: list[tuple[str, bytes]], value: bytes = b"body") -> Message:
    """A record as the scanner's consumer hands it out."""
    return Message(topic="ns.topic.t", partition=0, offset=offset, value=value, key=None,
                   headers=headers, timestamp=(1, 1_700_000_000_000 + offset))


def _alike_records() -> list[Message]:
    """Records whose ``bucket`` is many things: numbers of both kinds, a
    boolean, a string, NULL, missing; one whose properties are not JSON;
    subjects for the system scope."""
    props = [b'{"bucket":1}', b'{"bucket":2}', b'{"bucket":1.0}', b'{"bucket":"1"}',
             b'{"bucket":true}', b'{"bucket":null}', b"{}", b'{"Bucket":3}', b"not json",
             b'{"bucket":{"$uuid":"3f2a0000-0000-0000-0000-000000000001"}}', b'{"bucket":2}']
    subjects = [b"a", b"b", None]
    records = []
    for offset in range(60):
        headers = [("application-properties", props[offset % len(props)])]
        subject = subjects[offset % len(subjects)]
        if subject is not None:
            headers.insert(0, ("subject", subject))
        records.append(_record(offset, headers if offset % 13 else [], b"x" * (offset % 4)))
    return records


@pytest.mark.parametrize("expression", [
    "bucket = 1", "bucket > 1", "bucket <> 2", "EXISTS(bucket)", "bucket IS NULL",
    "bucket IN (1, 2)", "bucket = 'x'", "sys.label = 'a'", "sys.subject <> 'a'",
    "sys.size > 1", "sys.nosuch = 1",
])
def test_rules_asked_once_per_group_of_alike_records_decide_as_one_by_one(
        expression: str) -> None:
    """A subscription whose rules read one property is asked once per group
    of records alike in it (the same application-properties header; for a
    system property, the same type and value): what it leaves out and
    selects is what asking each record says. Records whose group failed the
    filter, or broke the format, are left to be asked one by one."""
    rules = RuleSet([RuleSpec("r", {"type": "sql", "expression": expression})])
    assert rules.decided_by is not None
    reads = [log_scanner._Read(record) for record in _alike_records()]
    may_select, selected = log_scanner._verdicts(
        log_scanner._Grouped(reads, rules.decided_by), rules)
    one_by_one = {read.offset: rules.selects(view) if (view := read.view()) is not None else None
                  for read in reads}
    assert [read.offset for read in may_select] == [
        o for o, verdict in one_by_one.items() if verdict is not False]
    assert selected == {o for o, verdict in one_by_one.items() if verdict is True}
    assert len(log_scanner._Grouped(reads, rules.decided_by).alike) < len(reads) / 2


def test_what_the_rules_leave_out_goes_as_the_runs_between_the_records_kept() -> None:
    def runs(offsets: list[int], kept: list[int], end: int) -> list[int]:
        reads = [log_scanner._Read(Message(topic="t", partition=0, offset=o, value=b"",
                                           headers=[])) for o in offsets]
        return log_scanner._runs_left_out(reads, kept, end)

    assert runs(list(range(10, 20)), [12, 13, 17], 20) == [10, 12, 14, 17, 18, 20]
    assert runs(list(range(10, 20)), [10, 19], 20) == [11, 19]
    assert runs(list(range(10, 20)), list(range(10, 20)), 20) == []
    assert runs(list(range(10, 20)), [], 20) == [10, 20]
    assert runs(list(range(10, 20)), [12, 15], 16) == [10, 12, 13, 15]  # cut short at 16
    # holes in the log (a transaction's marker at 13, compacted 16-17) are no records
    assert runs([10, 11, 12, 14, 15, 18, 19], [11, 19], 20) == [10, 11, 12, 13, 14, 16, 18, 19]


def test_rules_that_read_more_than_one_property_are_asked_of_each_record() -> None:
    """Only rules whose verdict one property decides are grouped."""
    assert RuleSet([RuleSpec("r", {"type": "sql", "expression": "a = 1 AND b = 2"})]
                   ).decided_by is None
    assert RuleSet([RuleSpec("r", {"type": "sql", "expression": "p('a') = 1"})]).decided_by \
        is None
    assert RuleSet([RuleSpec("r", {"type": "sql", "expression": "newid() = a"})]).decided_by \
        is None
    assert RuleSet([RuleSpec("r", {"type": "correlation", "properties": {"a": 1}})]
                   ).decided_by is None
    assert RuleSet([RuleSpec("a", {"type": "sql", "expression": "x = 1"}),
                    RuleSpec("b", {"type": "sql", "expression": "X > 5"})]).decided_by \
        == ("user", "x")
