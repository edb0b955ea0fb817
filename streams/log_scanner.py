"""The log scanner: reads the headers of entities that need them, in bulk.

Only queues and subscriptions with duplicate detection, a default time to
live, forwarding or (subscriptions) filters are scanned (``Policy.scanned``);
plain queues and subscriptions that take every message never pay for it.
A subscription's rules are evaluated here, once per message, so it is
handed out only what its filters select. The scanner runs in the
engine process, off the event loop, with one assigned consumer per log
partition, and turns each batch of records into one ``accept`` command
(``streams.acceptance``): duplicates, due times and expiries of the offsets
it read. It keeps nothing durable of its own: the window records how far it
was accepted, and the duplicate-detection history is rebuilt from the log
itself (first occurrence wins), so it survives a restart unchanged.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from streams.acceptance import (
    BAD_SESSION,
    DUPLICATE,
    FILTER_FAILED,
    FILTERED,
    NO_SESSION,
    PLAIN,
    AcceptArgs,
    Item,
)
from streams.definitions import Definitions
from streams.forwarding import Forwarder
from streams.window import InflightWindow
from topics import names
from topics.commands import Command, DeadForwardedArgs, valid_session_id
from topics.connection import ConnectionSettings
from topics.message_record import (
    MalformedRecord,
    ScannedHeaders,
    filter_properties,
    may_be_timed,
    raw_application_properties,
    scanned_headers,
)
from topics.offsets import OFFSET_UNKNOWN, GapGuard, offset_of, position_of, take
from topics.partitions import session_partition
from topics.rule_set import RuleSet
from topics.rules import MessageView
from topics.runs import as_runs

log = logging.getLogger(__name__)
MAX_RECORDS = 5000
#: most messages one accept records a filter error for (each is stored with it)
MAX_FILTER_FAILURES = 500
#: characters of a filter error kept with the message
_MAX_ERROR = 300
#: most sessions one accept files messages under (each costs the commit a
#: session record and a list of offsets)
MAX_SESSIONS_PER_ACCEPT = 1000

#: how long a window that does not move on holds back the windows ahead of it
#: (:meth:`LogScanner._read`): one no longer scanned, or whose accepts wait
#: (the time of its commands partition not known), does not stop the others
_PLACE_KEPT_S = 5.0

#: dead letters looked at per scan for forward_dead_letters_to
_DEAD_LETTERS_PER_SCAN = 1_000


class Scanned(NamedTuple):
    """What a scan of one window found: its commands, and whether its log
    holds more than they take (an accept cut at a limit: scan again soon)."""

    commands: list[Command]
    more: bool


class LogScanner:
    """Scans from a worker thread; :meth:`reset` may come from another."""

    def __init__(self, settings: ConnectionSettings,
                 definitions: Callable[[], Definitions]) -> None:
        self._settings = settings
        self._definitions = definitions
        self._lock = threading.Lock()
        #: per log partition, one consumer and where it stands, for every
        #: window scanning it (a topic's subscriptions share it: a consumer
        #: each fetched the topic ten times over), and where each of those
        #: windows last read (beside it, the monotonic time it got there)
        self._consumers: dict[tuple[str, int], Consumer] = {}
        #: per log partition: an offset read past is read again, not taken
        #: for one without a record (Tansu)
        self._in_order: dict[tuple[str, int], GapGuard] = {}
        self._positions: dict[tuple[str, int], int] = {}
        self._readers: dict[tuple[str, int], dict[str, tuple[int, float]]] = {}
        #: per log partition, the last MAX_RECORDS records its consumer read,
        #: ending where it stands (bounded by the number of scanned log
        #: partitions): the windows of a topic's subscriptions read them all
        self._recent: dict[tuple[str, int], list[_Read]] = {}
        #: window key -> message id -> (offset, enqueued ms), oldest first
        self._seen: dict[str, OrderedDict[str, tuple[int, int]]] = {}
        #: window key -> (its log partition, where its last scan found the
        #: log's end): until the log grows, passed over without loading it
        self._at_end: dict[str, tuple[tuple[str, int], int]] = {}
        #: dead letters already copied to their forward target (not yet removed)
        self._dead_sent: set[tuple[str, int]] = set()
        #: per log partition and property, the last records grouped by the
        #: property's value (:meth:`_alike`): the subscriptions of a topic
        #: that stand at the same offset filter on the same records
        self._grouped: dict[tuple[tuple[str, int], tuple[str, str]], _Grouped] = {}
        self._forwarder = Forwarder(settings)

    def scan(self, window: InflightWindow) -> Scanned:
        """Commands for what changed in ``window``'s log: an ``accept`` for its
        next records, a ``dead_forwarded`` for dead letters moved on."""
        with self._lock:
            accept, more = self._scan(window)
            commands = [accept, self._forward_dead_letters(window)]
            return Scanned([c for c in commands if c is not None], more)

    def nothing_new(self, key: str) -> bool:
        """Whether the log of window ``key`` has not grown since its last
        scan found nothing to accept or forward (no window is loaded for it:
        twenty idle session queues cost the engine 0.09 of a core when each
        was loaded to be scanned every 50 ms, 0.03 before that)."""
        with self._lock:
            at = self._at_end.get(key)
            consumer = self._consumers.get(at[0]) if at is not None else None
            return (at is not None and consumer is not None
                    and _read_to_end(consumer, at[0], at[1]))

    def reset(self) -> None:
        """Forget histories and positions: after a rebalance another worker
        may have accepted records of a window this one will own again."""
        with self._lock:
            self._at_end.clear()
            self._seen.clear()
            self._dead_sent.clear()
            self._positions.clear()
            self._recent.clear()
            self._grouped.clear()

    def _scan(self, window: InflightWindow) -> tuple[Command | None, bool]:
        """The accept of the window's next records, if any, and whether the
        log holds more than it takes (cut at a limit)."""
        assert window.scanned is not None
        key = f"{window.entity}#{window.partition}"
        # Each scan goes on from where the window stands: the accepts of the
        # last pass were applied before this one began (scan_timer awaits
        # them). An accept that was not (its partition's time unknown, the
        # window moved) is scanned again at once; going on from where it
        # ended instead refused every accept after it until that was noticed
        # (5 s): a stall of that shape kept subscriptions waiting 6-24 s in
        # one bench-topics run of about twenty (2026-11-27, not reproduced).
        start = window.scanned
        tp = (names.entity_log(self._settings.namespace, window.entity), window.partition)
        if window.duplicate_window_ms and key not in self._seen:
            self._rebuild_history(key, tp, window)
        records = self._read(key, tp, start)
        self._at_end.pop(key, None)
        if not records:
            if not window.forward_dead_letters_to:
                self._at_end[key] = (tp, start)
            return None, False
        more = len(records) >= MAX_RECORDS  # as many as one read takes
        now = int(time.time() * 1000)
        items, to_forward = [], []
        #: offset -> what the rule actions made of a forwarded record's properties
        actioned: dict[int, dict[str, Any]] = {}
        rules = self._definitions().rules(window.entity)
        found = self._definitions().policy(window.entity)
        dead_letter_errors = found is not None and found[1].dead_letter_filter_errors
        end = records[-1].offset + 1
        failures = 0
        partitions = found[1].partitions if found is not None else 1
        sessions: set[str] = set()
        # Most records of most windows: no expiry, no schedule, no duplicate
        # check (ten subscriptions ask it of each record).
        timed = bool(window.duplicate_window_ms or window.default_ttl_ms)
        selects = rules.selects if rules is not None else None
        read_slice = records
        kept: list[int] = []  # the offsets of those the rules do not leave out
        selected_alike: set[int] = set()
        if (rules is not None and rules.decided_by is not None
                and not window.duplicate_window_ms):  # every record is checked for duplicates
            records, selected_alike = self._alike(tp, records, rules, rules.decided_by)
        for read in records:
            item = self._item(key, window, read, now) if timed or not read.untimed else None
            if (selects is not None and (item is None or item.mark == PLAIN)
                    and read.offset not in selected_alike):
                # the rules' verdict of one record (what grouping left to
                # ask); a failed filter is looked at again, for its error
                view = read.view()
                selected = selects(view) if view is not None else True
                if selected is False:
                    continue
                if selected is None:
                    assert rules is not None and view is not None
                    item = _filter_failed(rules, view, read.offset, item, dead_letter_errors)
            kept.append(read.offset)
            if window.forward_to and (item is None or item.mark == PLAIN):
                to_forward.append(read.record)  # the target applies time to live and schedule
                if rules is not None and rules.has_actions:
                    _note_actions(rules, read, actioned)
                continue
            if window.requires_session and (item is None or item.mark == PLAIN):
                item = _in_session(read, item or Item(read.offset), partitions)
                if item.session is not None and item.session not in sessions:
                    if len(sessions) >= MAX_SESSIONS_PER_ACCEPT:
                        end = read.offset  # the next scan goes on from here
                        more = True
                        break
                    sessions.add(item.session)
            if item is not None:
                items.append(item)
            failures += item is not None and item.error is not None
            if failures >= MAX_FILTER_FAILURES:
                # Each failure is stored with its error: keep the accept small
                # enough to store at once; the next scan goes on from here.
                end = read.offset + 1
                more = True
                break
        if to_forward:
            assert window.forward_to is not None
            items += self._forwarder.forward(to_forward, window.forward_to, actioned)
        left_out = _runs_left_out(read_slice, kept, end) if selects is not None else []
        return Command(f"accept-{uuid.uuid4().hex}", window.entity, window.partition,
                       AcceptArgs(start, end, tuple(items), tuple(left_out))), more

    def _alike(self, tp: tuple[str, int], records: list[_Read], rules: RuleSet,
               decided_by: tuple[str, str]) -> tuple[list[_Read], set[int]]:
        """:func:`_verdicts` of ``records``, grouped once for the windows that
        read the same ones (the subscriptions of a topic that keep up)."""
        grouped = self._grouped.get((tp, decided_by))
        if grouped is None or not grouped.holds(records):
            grouped = self._grouped[(tp, decided_by)] = _Grouped(records, decided_by)
        return _verdicts(grouped, rules)

    def _forward_dead_letters(self, window: InflightWindow) -> Command | None:
        if not window.forward_dead_letters_to:
            return None
        dead = {o: (reason, description)
                for o, reason, description in window.dead_letters(_DEAD_LETTERS_PER_SCAN)}
        key = f"{window.entity}#{window.partition}"
        fresh = sorted(o for o in dead if (key, o) not in self._dead_sent)
        if not fresh:
            return None
        topic = names.entity_log(self._settings.namespace, window.entity)
        copied = self._forwarder.forward_dead_letters(topic, window.partition, fresh[:500], dead,
                                                      window.forward_dead_letters_to)
        self._dead_sent.update((key, o) for o in copied)
        if not copied:
            return None
        return Command(f"dead-forwarded-{uuid.uuid4().hex}", window.entity, window.partition,
                       DeadForwardedArgs(tuple(copied)))

    def _item(self, key: str, window: InflightWindow, read: _Read, now: int) -> Item | None:
        headers = read.headers
        enqueued = read.record.timestamp()[1]
        offset = read.offset
        message_id = headers.message_id
        if window.duplicate_window_ms and message_id is not None:
            if self._remember(key, message_id, offset, enqueued, window.duplicate_window_ms):
                return Item(offset, mark=DUPLICATE)
        ttls = [t for t in (headers.time_to_live_ms, window.default_ttl_ms) if t]
        expires = enqueued + min(ttls) if ttls else 0
        due = headers.scheduled_enqueue_time_ms
        due = due if due > now else 0
        return Item(offset, expires, due) if expires or due else None

    def _remember(self, key: str, message_id: str, offset: int, enqueued: int,
                  window_ms: int) -> bool:
        """Record an id; True when an earlier offset had it within the window."""
        seen = self._seen.setdefault(key, OrderedDict())
        while seen:  # forget what has left the detection window
            oldest_id, (_, at) = next(iter(seen.items()))
            if at >= enqueued - window_ms:
                break
            del seen[oldest_id]
        first = seen.get(message_id)
        if first is not None and first[0] < offset and enqueued - first[1] <= window_ms:
            return True
        if first is None:
            seen[message_id] = (offset, enqueued)
        return False

    def _rebuild_history(self, key: str, tp: tuple[str, int], window: InflightWindow) -> None:
        """Ids of the detection window before ``scanned``, read again from the log."""
        assert window.scanned is not None
        self._seen[key] = OrderedDict()
        since = int(time.time() * 1000) - window.duplicate_window_ms
        consumer = self._consumer(tp)
        try:
            found = consumer.offsets_for_times([TopicPartition(*tp, since)], timeout=10)[0]
            start = found.offset if found.offset >= 0 else window.scanned
        except KafkaException:
            start = 0
        # ListOffsets may answer low on some brokers (Tansu): reading more is harmless.
        position = min(start, window.scanned)
        while position < window.scanned:
            records = self._read(key, tp, position, until=window.scanned)
            if not records:
                break
            for read in records:
                message_id = read.headers.message_id
                if message_id is not None:
                    self._remember(key, message_id, read.offset, read.record.timestamp()[1],
                                   window.duplicate_window_ms)
            position = records[-1].offset + 1
        log.info("rebuilt duplicate history of %s: %d ids", key, len(self._seen[key]))

    def _read(self, key: str, tp: tuple[str, int], start: int, until: int | None = None
              ) -> list[_Read]:
        """The records of ``tp`` from ``start`` on (before ``until``).

        The windows reading ``tp`` (a topic's subscriptions) share one
        consumer, which the window furthest behind drives: the records it
        read are kept (the last MAX_RECORDS, ending where it stands), a window
        within them is served from them, and a window past them waits until
        the one behind has read up to it. The consumer is moved only by the
        window furthest behind, and only when it is not within reach of the
        consumer's reads. Before, a window behind moved it back, one ahead
        moved it forward again, and each move waited out the fetch parked at
        the log end (Apache Kafka: 500 ms): ten subscriptions that had drifted
        apart (a window is scanned from up to a second after its subscription
        is created) took turns moving it and drained 5-20 s late in about one
        bench-topics run of four."""
        readers = self._readers.setdefault(tp, {})
        now = time.monotonic()
        was = readers.get(key)
        readers[key] = (start, was[1] if was is not None and was[0] == start else now)
        kept = self._recent.get(tp, [])
        if kept and kept[0].offset <= start:
            first = bisect.bisect_left(kept, start, key=lambda r: r.offset)
            if first < len(kept):
                return _before(kept[first:], until)
        if start > min(place for place, since in readers.values()
                       if now - since < _PLACE_KEPT_S or place == start):
            return []  # served once the window behind has read up to here
        consumer = self._consumer(tp)
        position = self._positions.get(tp)
        if position is not None and (kept[0].offset if kept else position) <= start <= (
                position + MAX_RECORDS):
            if _read_to_end(consumer, tp, position):
                # Nothing appended since the last read: no wait for it. Every
                # window scanned in a round waited 50 ms for nothing before, so
                # a queue's scan took turns with each idle one (100,000 new
                # sessions beside two idle session queues: accepted in 19 s,
                # 7.4 s alone).
                return []
        else:
            end = _known_end(consumer, tp)
            if end is not None and start >= end:
                return []  # nothing past start, as the last fetch saw the log: no move
            assigned = [TopicPartition(*tp, start)]
            if position is not None and self._settings.profile.wakes_waiting_fetches:
                consumer = self._replace_consumer(tp)
            consumer.assign(assigned)
            self._in_order[tp].moved(assigned)
            self._positions[tp] = start
            self._recent[tp] = kept = []
        records = [_Read(r) for r in self._in_order[tp].admit(
            consumer, take(consumer, MAX_RECORDS, 0.05)) if r.error() is None]
        if records:
            self._positions[tp] = records[-1].offset + 1
            self._recent[tp] = (kept + records)[-MAX_RECORDS:]
        first = bisect.bisect_left(records, start, key=lambda r: r.offset)
        return _before(records[first:], until)

    def _consumer(self, tp: tuple[str, int]) -> Consumer:
        """The consumer of log partition ``tp``."""
        if tp not in self._consumers:
            self._consumers[tp] = Consumer(
                self._settings.consumer_config(f"scanner-{uuid.uuid4().hex[:8]}"))
            self._in_order[tp] = GapGuard(
                tp[0], enabled=self._settings.profile.skips_unfinished_appends)
        return self._consumers[tp]

    def _replace_consumer(self, tp: tuple[str, int]) -> Consumer:
        """A new consumer for ``tp`` in place of one about to be moved. Its
        fetch most likely waits at the log end for new records (it fetches
        far ahead), on a broker that holds it there (Apache Kafka: up to
        fetch.wait.max.ms, 500 ms), and a consumer moved waits for it: a
        subscription created just before its topic was published began to
        be scanned 460 ms late, and the windows of the other subscriptions
        ahead of it waited for it (bench-topics' ten subscriptions drained
        in 0.8-1.1 s instead of 0.4; a new consumer reads its first record
        in about 10 ms)."""
        stale = self._consumers.pop(tp)
        stale.close()
        return self._consumer(tp)

    def release(self, key: str) -> None:
        """Close what reads the log of a window the engine forgot (its entity
        was deleted): its log is deleted next, and a librdkafka consumer
        still assigned to a deleted topic crashes the process on the
        embedded broker."""
        with self._lock:
            for tp, readers in list(self._readers.items()):
                readers.pop(key, None)
                if not readers:  # the last window reading it
                    del self._readers[tp]
                    consumer = self._consumers.pop(tp, None)
                    self._in_order.pop(tp, None)
                    if consumer is not None:
                        consumer.close()
                    self._positions.pop(tp, None)
                    self._recent.pop(tp, None)
                    for grouped in [g for g in self._grouped if g[0] == tp]:
                        del self._grouped[grouped]
            self._at_end.pop(key, None)
            self._seen.pop(key, None)

    def close(self) -> None:
        self._forwarder.close()
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()
        self._readers.clear()


def _read_to_end(consumer: Consumer, tp: tuple[str, int], position: int) -> bool:
    """Whether ``position`` is at the log end as the consumer's latest fetch
    response said (it waits at the end for new records, and Apache Kafka
    answers as soon as one comes; Tansu within its short fetch wait)."""
    end = _known_end(consumer, tp)
    return end is not None and position >= end


def _before(records: list[_Read], until: int | None) -> list[_Read]:
    """``records`` before offset ``until`` (all of them when None)."""
    return records if until is None else [r for r in records if r.offset < until]


def _known_end(consumer: Consumer, tp: tuple[str, int]) -> int | None:
    """The log end of ``tp`` as the consumer's latest fetch response said;
    None before it has one."""
    end: int = consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
    return None if end == OFFSET_UNKNOWN else end


class _Read:
    """A record as the scanner read it. The subscriptions of one topic scan
    the same records one after another, so what they look at (the headers,
    the properties their rules see) is read once: its headers' names as it
    is read, the rest on first use."""

    __slots__ = ("record", "offset", "untimed", "_raw_headers", "_headers", "_view",
                 "_properties")

    def __init__(self, record: Message) -> None:
        self.record = record
        self.offset = offset_of(record)
        #: confluent-kafka builds the list anew at every ``headers()``
        self._raw_headers = record.headers()
        #: whether no header could set a time to live or a schedule (their
        #: names alone: most records have neither, and ten subscriptions ask)
        self.untimed = not may_be_timed(self._raw_headers)
        self._headers: ScannedHeaders | None = None
        #: what rules see of it; False: a record that breaks the format
        self._view: MessageView | bool | None = None
        self._properties: str | bytes | None | object = _ABSENT

    @property
    def application_properties(self) -> str | bytes | None:
        """Its application-properties header, unread."""
        if self._properties is _ABSENT:
            self._properties = raw_application_properties(self._raw_headers)
        return self._properties  # type: ignore[return-value]

    @property
    def headers(self) -> ScannedHeaders:
        if self._headers is None:
            self._headers = scanned_headers(self._raw_headers)
        return self._headers

    def view(self) -> MessageView | None:
        """What rules see of the record; None when it breaks the format."""
        if self._view is None:
            record = self.record
            try:
                self._view = MessageView.indexed(*filter_properties(
                    record.value(), self._raw_headers, record.timestamp()[1],
                    position_of(record)[0], self.offset))
            except MalformedRecord:
                self._view = False
        return self._view if isinstance(self._view, MessageView) else None


#: value types whose (type, value) decides a rule as well as the value itself
#: (``object``: :data:`_ABSENT`)
_ALIKE = frozenset({str, int, float, bool, type(None), object})
#: the value of a property a record does not have (``EXISTS`` tells it from
#: NULL), and of what a record has not been asked yet
_ABSENT = object()


def _offset(read: _Read) -> int:
    return read.offset


class _Grouped:
    """Records grouped by what decides a rule that reads one property alone.
    An application property: by the records' application-properties header
    as written (the same header, the same properties; the rest of the record
    is not read, so a record that breaks the format elsewhere goes with its
    group). A system property: by its type and value on each record (one of
    another type than a plain scalar, or that breaks the format, is a group
    of its own)."""

    __slots__ = ("first", "last", "count", "alike")

    def __init__(self, records: list[_Read], read: tuple[str, str]) -> None:
        self.first, self.last, self.count = records[0].offset, records[-1].offset, len(records)
        scope, key = read
        groups: dict[object, list[_Read]] = {}
        for record in records:
            alike: object
            if scope == "user":
                alike = record.application_properties
            else:
                view = record.view()
                value = record if view is None else view.system_index.get(key, _ABSENT)
                alike = (type(value), value) if type(value) in _ALIKE else record
            group = groups.get(alike)
            if group is None:
                groups[alike] = [record]
            else:
                group.append(record)
        self.alike = list(groups.values())

    def holds(self, records: list[_Read]) -> bool:
        """Whether these are the records grouped (a window reads a slice of a
        partition's records: the same first, last and count, the same slice)."""
        return (self.first, self.last, self.count) == (
            records[0].offset, records[-1].offset, len(records))


def _verdicts(grouped: _Grouped, rules: RuleSet) -> tuple[list[_Read], set[int]]:
    """The records ``rules`` may select, in order (the others they leave
    out), and the offsets of those they select, the rules asked once per
    group of records alike in what decides them: ten subscriptions
    filtering a topic on ``bucket`` each asked of every record, in a loop,
    and read all of every record's properties for it (8-9 us a record,
    1.4-2.3 grouped). A group whose first record breaks the format or fails
    a filter is left to be asked one by one."""
    may_select: list[_Read] = []
    selected: set[int] = set()
    for reads in grouped.alike:
        view = reads[0].view()
        verdict = rules.selects(view) if view is not None else None
        if verdict is False:
            continue
        if verdict:
            selected.update(read.offset for read in reads)
        may_select += reads
    if len(grouped.alike) > 1:
        may_select.sort(key=_offset)
    return may_select, selected


def _runs_left_out(records: list[_Read], kept: list[int], end: int) -> list[int]:
    """The offsets of ``records`` before ``end`` that are not ``kept`` (both
    in order), as flat ``[first, end)`` runs (``topics.runs``):
    the gaps between the kept ones, so a subscription that selects one
    record in ten costs a step per selected record, not per record left out.
    A log with holes in its offsets (transaction markers, compaction) is
    gone through record by record: a hole is no record to leave out."""
    if not records:
        return []
    first = records[0].offset
    if records[-1].offset - first + 1 != len(records):
        kept_set = set(kept)
        return as_runs([r.offset for r in records if r.offset < end and r.offset not in kept_set])
    runs: list[int] = []
    for offset in kept:
        if offset > first:
            runs += (first, offset)
        first = offset + 1
    if end > first:
        runs += (first, end)
    return runs


def _filter_failed(rules: RuleSet, view: MessageView, offset: int, item: Item | None,
                   dead_letter_errors: bool) -> Item:
    """The accept item of a record a filter of the subscription failed on:
    dead-lettered (``dead_letter_filter_errors``), left out saying why, or
    handed out with the error (another rule matched)."""
    verdict = rules.evaluate(view)
    error = "; ".join(f"rule {name!r}: {why}" for name, why in verdict.failures)[:_MAX_ERROR]
    if dead_letter_errors:
        return Item(offset, mark=FILTER_FAILED, error=error)
    if not verdict.matched:
        return Item(offset, mark=FILTERED, error=error)
    return replace(item or Item(offset), error=error)


def _note_actions(rules: RuleSet, read: _Read, actioned: dict[int, dict[str, Any]]) -> None:
    """What the actions of the rules that select ``read`` make of its
    application properties, under its offset in ``actioned`` (nothing when
    no rule with an action selects it): a forwarded copy carries them, as
    Service Bus applies a rule's action when it evaluates the rule."""
    view = read.view()
    if view is None:
        return
    verdict = rules.evaluate(view)
    if verdict.actions:
        actioned[read.offset] = rules.apply_actions(view, verdict.actions)


def _in_session(read: _Read, item: Item, partitions: int) -> Item:
    """The item with the record's session; a record no session can take is
    marked for the dead letters (a session lives in one partition: the one
    Kafka's murmur2 partitioner gives its id, as senders key by it)."""
    session = read.headers.session_id
    record = read.record
    if session is None:
        return replace(item, mark=NO_SESSION)
    if not valid_session_id(session):
        return replace(item, mark=BAD_SESSION, error=(
            f"session id {session[:40]!r} is not 1..128 printable characters"))
    home = session_partition(session, partitions)
    if home != record.partition():
        return replace(item, mark=BAD_SESSION, error=(
            f"session {session!r} lives in partition {home}, but this record is in partition "
            f"{record.partition()}: key session messages by their session id with Kafka's "
            "murmur2 partitioner (confluent-kafka: partitioner=murmur2_random)"))
    return item.with_session(session)
