"""Reads granted offsets of an entity's log straight from Kafka.

The engine grants offsets; payloads never pass through it. A reader is one
consumer of one log partition, assigned (never subscribed), moved only when
a grant is far from where it stopped. A client's receivers take readers from
its :class:`ReaderPool` and give them back when they close, so a receiver
per session costs no new consumer, and receivers read side by side. Records
a reader reads past on the way to the wanted ones are kept for the next
reads of any reader of that partition (:class:`Kept`): the messages of one
session lie scattered through the log, between other sessions', so the
receivers of a client draining sessions read the log about once instead of
seeking for every message. The high watermark of the latest fetch response
tells the engine how far the log goes (ListOffsets cannot be trusted for
that on every broker; see ``topics.offsets``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from settlement.exceptions import ServiceBusCommunicationError, denied
from topics.connection import ConnectionSettings
from topics.names import entity_of_log
from topics.offsets import OFFSET_UNKNOWN, GapGuard, listed_end, listed_start, offset_of, take

#: most bytes of records read past and kept for later reads: the size of
#: librdkafka's own fetch queue by default (``queued.max.messages.kbytes``)
_AHEAD_BYTES = 64 << 20
#: the same where every record read is kept (:attr:`Kept.fan_out`), per
#: receiver sharing the reader, up to :data:`_AHEAD_BYTES`: those a read took
#: stay too, so the keep is always full, and one subscription of a topic read
#: alone would hold 64 MB it never reads again. Several drift apart by up to
#: a receive each, read ahead too: ten subscriptions of a 20 MB topic in
#: 16 MB read the log 3.2 times over when drained one after another (2.0
#: times in about one drain of six in threads), once in 64 MB.
_FAN_OUT_BYTES = 16 << 20
#: a gap up to this size is read through rather than sought over: measured on
#: Apache Kafka here, a seek costs what reading about 2 MB costs (7-10 ms
#: against 4-6 ms per MB), and what is read through is kept for other reads
_READ_THROUGH_BYTES = 4 << 20
#: records taken from the consumer at once, of those it has fetched (a fetch
#: brings up to 1 MB of a partition): past a seek, the neighbours of the
#: record sought are other sessions' messages, wanted soon
_TAKE_AT_ONCE = 1000
#: most records read before the first one wanted when seeking for scattered
#: offsets (see PartitionReader._read)
_BACK_AT_MOST = 64
#: what a record is taken to weigh until the reader has seen some
_FIRST_RECORD_BYTES = 1024
#: what a reader's consumer fetches ahead of what was taken from it
#: (``queued.max.messages.kbytes``)
_FETCHED_AHEAD_BYTES = 16 << 20
#: idle readers a client keeps for its next receivers (each is a librdkafka
#: consumer: four threads and its connections): beyond, the one given back
#: longest ago is closed, with what its partition kept once no reader of it
#: is left. Before, a client kept one for every partition it had read
#: (tests/test_leaks.py: 12 queues read left 16 threads and 32 descriptors
#: more than 8 did).
IDLE_READERS = 8
#: how long the readers of a partition may all be idle before what they kept
#: goes: up to 16-64 MB of records each, walked by every full garbage
#: collection (bench-topics' client held every record of each topic it had
#: drained); the next session's receiver comes within milliseconds and reads
#: what the last one read past (bench-sessions: 2,936 msg/s keeping it, 541
#: with it dropped at once)
KEEP_IDLE_S = 1.0


class Kept:
    """Records of one log partition that readers read past, oldest first, up
    to :data:`_AHEAD_BYTES` (:data:`_FAN_OUT_BYTES`); shared by the readers
    of a client. Thread-safe.

    ``fan_out``: every record read is kept, the wanted ones too, and a read
    takes its records without removing them: the log of a topic, where a
    record is wanted by each subscription whose rules select it (the ``all``
    of a topic with subscriptions ``all``, ``low`` and ``high`` reads the
    records ``low`` took, on the same reader, a second behind it)."""

    def __init__(self, fan_out: bool = False) -> None:
        self.fan_out = fan_out
        self._most = _FAN_OUT_BYTES if fan_out else _AHEAD_BYTES
        self._records: OrderedDict[int, Message] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: held by a reader reading scattered offsets of the partition: one
        #: reads at a time, and the others then take what it read past (the
        #: receivers of a topic's ten subscriptions, each reading every tenth
        #: record, read the log ten times over side by side: their first reads
        #: took 0.4-1.4 s). Offsets granted together are read without it: four
        #: receivers of a queue waiting for each other settled 9,882 msg/s
        #: instead of 16,117 in make bench.
        self.reading = threading.Lock()
        #: what a record weighs, a running mean
        self.record_bytes = float(_FIRST_RECORD_BYTES)
        #: offsets some reader read through since the last seek away from
        #: them (see :meth:`keep`)
        self._read = range(0)

    def take(self, offsets: list[int]) -> dict[int, Message]:
        """The kept records at ``offsets``, no longer kept (still kept
        where :attr:`fan_out`)."""
        found: dict[int, Message] = {}
        with self._lock:
            if self.fan_out:
                return {o: r for o in offsets if (r := self._records.get(o)) is not None}
            for offset in offsets:
                record = self._records.pop(offset, None)
                if record is not None:
                    found[offset] = record
                    self._bytes -= _size(record)
        return found

    def shared_by(self, receivers: int) -> None:
        """Bound a fan-out keep for ``receivers`` reading side by side
        (:data:`_FAN_OUT_BYTES` each); the oldest kept go first when over."""
        if not self.fan_out:
            return
        with self._lock:
            self._most = min(_AHEAD_BYTES, _FAN_OUT_BYTES * max(1, receivers))
            self._trim()

    def clear(self) -> None:
        """Keep nothing: no reader of the partition is in use."""
        with self._lock:
            self._records.clear()
            self._bytes = 0
            self._read = range(0)

    def peek(self, offsets: range) -> dict[int, Message]:
        """The kept records at ``offsets``, still kept."""
        with self._lock:
            return {o: r for o in offsets if (r := self._records.get(o)) is not None}

    def keep(self, records: list[tuple[int, Message]], through: range) -> None:
        """Keep ``records``, read past by a read of the offsets ``through``;
        the oldest kept go first when over the bound. A record of offsets a
        reader read through before is not kept again: it was kept then, or
        taken since by the read that wanted it, and a copy kept now would be
        for nobody. (Receivers of one queue in threads read past each
        other's grants: make bench's client held 18,000 such copies, 18 MB
        and a fifth of its objects, by its asyncio phase; none with this.)"""
        with self._lock:
            before = self._read
            for offset, record in records:
                if offset in before or offset in self._records:
                    continue
                size = _size(record)
                self.record_bytes += (size - self.record_bytes) / 64
                self._records[offset] = record
                self._bytes += size
            if through and through.start <= before.stop and before.start <= through.stop:
                self._read = range(min(before.start, through.start),
                                   max(before.stop, through.stop))
            elif through:  # a seek away: what was read through before is forgotten
                self._read = through
            self._trim()

    def _trim(self) -> None:
        """Let the oldest kept go while over the bound (the lock held)."""
        while self._bytes > self._most:
            offset, record = self._records.popitem(last=False)
            self._bytes -= _size(record)
            # gone for good unless a read through it keeps it again
            self._read = range(max(self._read.start, offset + 1), self._read.stop)


class PartitionReader:
    """Fetches records of one partition by offset and tracks its log end.
    Thread-safe: a receiver's read-ahead reads from another thread."""

    def __init__(self, settings: ConnectionSettings, topic: str, partition: int,
                 kept: Kept | None = None) -> None:
        self.topic, self.partition = topic, partition
        self._tp = TopicPartition(topic, partition)
        self._config = settings.consumer_config(f"reader-{uuid.uuid4().hex[:12]}")
        self._config["queued.max.messages.kbytes"] = _FETCHED_AHEAD_BYTES >> 10
        #: whether a fetch at the log end waits there for new records (up to
        #: ``fetch.wait.max.ms``) rather than returning at once
        self._fetch_waits = settings.profile.wakes_waiting_fetches
        self._consumer = Consumer(self._config)
        try:
            self._position = self._first_position(settings)
        except KafkaException:
            try:
                self._raise_if_denied(
                    self._consumer.list_topics(topic, timeout=10).topics[topic].error)
            finally:  # nobody gets this reader to close: its consumer goes now
                self._consumer.close()
            raise
        start = [TopicPartition(topic, partition, self._position)]
        self._consumer.assign(start)
        #: an offset passed over is read again, not taken for a gap (Tansu)
        self._in_order = GapGuard(topic, start=start,
                                  enabled=settings.profile.skips_unfinished_appends)
        self._kept = Kept() if kept is None else kept
        self._hw = OFFSET_UNKNOWN
        self._lock = threading.RLock()

    def _first_position(self, settings: ConnectionSettings) -> int:
        """Where the consumer starts. Where the broker trims logs
        (DeleteRecords), at the log start: the engine trims an entity's log
        up to the oldest offset it may still hand out, so the first grants
        most likely lie there, and the consumer fetches them while the
        engine locks them. The first read of a topic's ten subscriptions
        sought there from the end and waited 20-45 ms for the first records
        (bench-topics; the drain is 0.4 s). Elsewhere the log keeps its
        history, which a reader would fetch for nothing: before the end
        ListOffsets reports (on Tansu a lower bound of it), whose fetch
        answers with the log end at once."""
        tp = (self.topic, self.partition)
        if settings.profile.deletes_records:
            return listed_start(self._consumer, tp, time.monotonic() + 10)
        return max(0, listed_end(self._consumer, tp, time.monotonic() + 10) - 1)

    def high_watermark(self, timeout: float = 5.0) -> int:
        """The log end seen in the latest fetch response (waits for the first).
        While another read holds the reader, the end it last saw: that read
        refreshes it as it goes. The receivers of a topic's ten
        subscriptions share one reader, and each acquire asks this first:
        waiting for the others' reads made each wait 4-8 ms (up to 110)
        before its acquire was even sent."""
        if not self._lock.acquire(blocking=False):
            if self._hw != OFFSET_UNKNOWN:
                return self._hw
            self._lock.acquire()
        try:
            return self._high_watermark(timeout)
        finally:
            self._lock.release()

    def _high_watermark(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            self._refresh_hw()
            if self._hw != OFFSET_UNKNOWN or time.monotonic() > deadline:
                return max(self._hw, 0)
            self._keep_all(500, 0.02)

    def _refresh_hw(self) -> None:
        high = self._consumer.get_watermark_offsets(self._tp, cached=True)[1]
        if high != OFFSET_UNKNOWN:
            self._hw = max(self._hw, high)

    def at_hand(self, offsets: range) -> dict[int, Message]:
        """The records at ``offsets`` this reader holds already: kept, or
        fetched by its consumer (never waited for). They stay kept for the
        read that wants them."""
        with self._lock:
            found = self._kept.peek(offsets)
            if len(found) < len(offsets) and offsets.start <= self._position < offsets.stop:
                fetched = self._keep_all(offsets.stop - self._position, 0)
                found.update((o, r) for r in fetched if (o := offset_of(r)) in offsets)
            return found

    def read(self, offsets: list[int], timeout: float = 10.0) -> dict[int, Message | None]:
        """Records at ``offsets``; an offset that holds no record (a gap left by
        a transaction marker, say) maps to None."""
        with self._lock:
            return self._read(offsets, timeout)

    def _read(self, offsets: list[int], timeout: float) -> dict[int, Message | None]:
        found: dict[int, Message | None] = dict(self._kept.take(offsets))
        wanted = sorted(set(offsets) - set(found))
        deadline = time.monotonic() + timeout
        if not wanted or wanted[-1] - wanted[0] < 2 * len(wanted):
            # Together (a queue's grants): what lies between is nobody else's.
            return self._read_through(wanted, found, deadline, timeout)
        if not self._kept.reading.acquire(timeout=timeout):
            raise ServiceBusCommunicationError(
                f"could not read offsets of {self._tp.topic}[{self._tp.partition}] within "
                f"{timeout}s: another reader of it did not finish")
        try:
            found.update(self._kept.take(wanted))  # what the reader before read past
            rest = [o for o in wanted if o not in found]
            # The records just before the first one wanted are, most likely,
            # those its neighbours want (the other subscriptions of a topic,
            # the other sessions of a queue): a seek starts a stride early, so
            # that their readers find them kept. Ten subscriptions of a
            # topic, each selecting every tenth record: the first reader
            # sought to its own first record, and each of the nine after it
            # then sought back to theirs in turn (a new consumer each, 10-220
            # ms; 0.5 s of a 1.5 s drain).
            back = min(rest[1] - rest[0] - 1, _BACK_AT_MOST) if len(rest) > 1 else 0
            return self._read_through(rest, found, deadline, timeout, back)
        finally:
            self._kept.reading.release()

    def _read_through(self, wanted: list[int], found: dict[int, Message | None],
                      deadline: float, timeout: float, back: int = 0
                      ) -> dict[int, Message | None]:
        """Read up to the last of ``wanted``, seeking where the reader is past
        the next one or far before it (``back`` records before it)."""
        while wanted:
            if time.monotonic() > deadline:
                raise ServiceBusCommunicationError(
                    f"could not read offsets {wanted[:5]}... of {self._tp.topic}"
                    f"[{self._tp.partition}] within {timeout}s"
                )
            gap = wanted[0] - self._position
            if gap < 0 or gap * self._kept.record_bytes > _READ_THROUGH_BYTES:
                self._seek(max(0, wanted[0] - back))
            want = set(wanted)
            passed = []
            at_once = min(max(len(wanted) + 50, _TAKE_AT_ONCE), 5000)
            start = self._position
            fan_out = self._kept.fan_out
            for record in self._take(take(self._consumer, at_once, 0.05)):
                offset = offset_of(record)
                if offset in want:
                    found[offset] = record
                    if fan_out:
                        passed.append((offset, record))
                else:
                    passed.append((offset, record))
            self._kept.keep(passed, range(start, self._position))
            # Offsets passed without a record are gaps: they hold nothing.
            for o in wanted:
                if o not in found and o < self._position:
                    found[o] = None
            wanted = [o for o in wanted if o not in found]
        return found

    def _keep_all(self, most: int, wait: float) -> list[Message]:
        """Take up to ``most`` records from the consumer (waiting up to
        ``wait`` seconds for the first) and keep them all."""
        start = self._position
        fetched = self._take(take(self._consumer, most, wait))
        self._kept.keep([(offset_of(record), record) for record in fetched],
                        range(start, self._position))
        return fetched

    def _raise_if_denied(self, err: KafkaError | None) -> None:
        refused = err and denied(err.name(), "the Listen right",
                                 f"queue {entity_of_log(self._tp.topic)!r}")
        if refused:
            raise refused

    def _take(self, records: list[Message]) -> list[Message]:
        good = []
        for record in self._in_order.admit(self._consumer, records):
            err = record.error()
            if err is not None:
                self._raise_if_denied(err)
                if err.code() != KafkaError._PARTITION_EOF:
                    raise ServiceBusCommunicationError(
                        f"reading {self._tp.topic}[{self._tp.partition}] failed: {err.str()}")
                continue
            self._position = offset_of(record) + 1
            good.append(record)
        self._refresh_hw()
        return good

    def _seek(self, offset: int) -> None:
        # what was read past stays kept: another read may want it
        target = TopicPartition(self._tp.topic, self._tp.partition, offset)
        if self._fetch_waits and self._fetched_to_end():
            # Its fetch waits at the log end, and a seek (or a pause, or a new
            # assignment) would wait for it: up to fetch.wait.max.ms, 500 ms.
            # A new consumer reads the first record in about 10 ms (measured
            # on Apache Kafka here: a seek back from the log end took 475-481
            # ms, and so the first read of every new reader took 480 ms).
            stale, self._consumer = self._consumer, Consumer(self._config)
            self._consumer.assign([target])
            stale.close()
        else:
            try:
                self._consumer.seek(target)
            except KafkaException:  # the fetcher has not started yet: assign instead
                self._consumer.assign([target])
        self._in_order.moved([target])
        self._position = offset

    def _fetched_to_end(self) -> bool:
        """Whether the consumer has likely fetched all there is: what lies
        between its position and the log end fits in what it fetches ahead."""
        return (self._hw - self._position) * self._kept.record_bytes <= _FETCHED_AHEAD_BYTES

    def close(self) -> None:
        with self._lock:
            self._consumer.close()


class ReaderPool:
    """The readers of one client: a receiver takes one per partition it
    reads and gives it back when it closes; the readers of a partition share
    what they keep. At most :data:`IDLE_READERS` wait for the next receiver.
    Closed with the client. Thread-safe.

    The receivers of a topic's subscriptions share one reader per partition
    of the topic's log (``shared``): each subscription reads its own records
    of the same log, and a reader each meant a consumer each, every one of
    them fetching the whole log ahead into its own queue (ten subscriptions:
    the client's librdkafka and the broker read each record ten times). With
    one, the log is fetched once and its :class:`Kept` (``fan_out``) hands
    each subscription its records: one consumer per partition and client,
    not one per subscription (bench-topics' rates moved within their noise
    with it; the broker's share of a core in the ten subscriptions' drain
    fell from 0.20-0.42 to 0.19-0.27, docs/benchmark-log.md, 2026-12-04).
    The first taker of a partition decides whether its keep fans out; a
    topic's log is only ever taken shared. The receivers of a queue take a
    reader each: they read the records granted to each of them, side by
    side."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        #: readers given back, the latest last
        self._idle: list[PartitionReader] = []
        self._kept: dict[tuple[str, int], Kept] = {}
        #: partition -> its readers, in use or idle
        self._readers: dict[tuple[str, int], int] = {}
        #: partition -> its shared reader and how many receivers use it
        self._shared: dict[tuple[str, int], tuple[PartitionReader, int]] = {}
        #: partition -> since when none of its readers is in use (time.monotonic())
        self._idle_since: dict[tuple[str, int], float] = {}
        #: partition -> held by the receiver making its shared reader: the
        #: others wait for that one rather than each making a consumer of its
        #: own, to close it when they find the first one made (the ten
        #: subscriptions' first receives made ten; closing the nine took one
        #: of them up to 700 ms before its acquire was sent). Dropped with the
        #: partition's last reader, as its keep is.
        self._making: dict[tuple[str, int], threading.Lock] = {}
        self._closed = False
        self._lock = threading.Lock()

    def take(self, topic: str, partition: int, *, shared: bool = False) -> PartitionReader:
        """A reader of ``topic[partition]``; with ``shared``, the one every
        receiver that asks so uses (see the class)."""
        if not shared:
            return self._take((topic, partition), shared=False)
        with self._lock:
            making = self._making.setdefault((topic, partition), threading.Lock())
        with making:
            return self._take((topic, partition), shared=True)

    def _take(self, key: tuple[str, int], *, shared: bool) -> PartitionReader:
        topic, partition = key
        with self._lock:
            # A client may be used again after close (as in the SDK): its
            # readers are pooled again (given back closed, each receiver
            # after that made a consumer of its own).
            self._closed = False
            self._drop_idle_keeps()
            self._idle_since.pop(key, None)
            if shared and key in self._shared:
                return self._share(key)
            for i in range(len(self._idle) - 1, -1, -1):
                if (self._idle[i].topic, self._idle[i].partition) == key:
                    reader = self._idle.pop(i)
                    if shared:
                        self._shared[key] = (reader, 0)
                        return self._share(key)
                    return reader
            kept = self._kept.setdefault(key, Kept(fan_out=shared))
            self._readers[key] = self._readers.get(key, 0) + 1
        try:
            reader = PartitionReader(self._settings, topic, partition, kept)
        except BaseException:
            with self._lock:
                self._forget(key)
            raise
        if not shared:
            return reader
        with self._lock:
            if key not in self._shared:
                self._shared[key] = (reader, 0)
                return self._share(key)
            # Made meanwhile by a taker holding a newer lock of _making (this
            # one's went with the partition's last reader): that one is
            # shared, and this one closed rather than left idle.
            self._forget(key)
            shared_reader = self._share(key)
        reader.close()
        return shared_reader

    def _share(self, key: tuple[str, int]) -> PartitionReader:
        reader, users = self._shared[key]
        self._shared[key] = (reader, users + 1)
        self._bound_keep(key, users + 1)
        return reader

    def _bound_keep(self, key: tuple[str, int], receivers: int) -> None:
        """Size the partition's keep for the receivers sharing its reader
        (none after :meth:`close`, which lets every keep go)."""
        kept = self._kept.get(key)
        if kept is not None:
            kept.shared_by(receivers)

    def give_back(self, reader: PartitionReader) -> None:
        key = (reader.topic, reader.partition)
        with self._lock:
            held = self._shared.get(key)
            if held is not None and held[0] is reader:
                if held[1] > 1:  # other receivers still read with it
                    self._shared[key] = (reader, held[1] - 1)
                    self._bound_keep(key, held[1] - 1)
                    return
                del self._shared[key]
            if self._closed:
                retired = [reader]
            else:
                self._idle.append(reader)
                retired = self._idle[:-IDLE_READERS]
                del self._idle[:-IDLE_READERS]
            for each in retired:
                self._forget((each.topic, each.partition))
            if key in self._kept and self._readers.get(key, 0) == sum(
                    (r.topic, r.partition) == key for r in self._idle):
                self._idle_since[key] = time.monotonic()  # nobody reads it now
            self._drop_idle_keeps()
        for each in retired:
            each.close()

    def _drop_idle_keeps(self) -> None:
        """Empty the keeps of partitions nobody has read for :data:`KEEP_IDLE_S`."""
        if not self._idle_since:
            return
        now = time.monotonic()
        for key, since in list(self._idle_since.items()):
            if now - since >= KEEP_IDLE_S:
                del self._idle_since[key]
                kept = self._kept.get(key)
                if kept is not None:
                    kept.clear()

    def _forget(self, key: tuple[str, int]) -> None:
        """One reader of ``key`` fewer; what it kept goes with the last."""
        self._readers[key] = self._readers.get(key, 1) - 1
        if self._readers[key] <= 0:
            del self._readers[key]
            self._kept.pop(key, None)
            self._idle_since.pop(key, None)
            self._making.pop(key, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle, self._kept, self._readers = self._idle, [], {}, {}
        for reader in idle:
            reader.close()


def _size(record: Message) -> int:
    """A record's weight in the reader's keep: its value's bytes (``len`` of
    a Message, in C; its key, a few bytes where there is one, left out: the
    keep bounds the bodies, and asking for both took 0.23 us a record
    against 0.06, twice for every record a receive reads ahead)."""
    return len(record)
