"""The engine reads its commands with librdkafka, not through Faust's stream.

Faust delivered each command through aiokafka (in a thread of its own), then
its consumer's dispatch and a stream, one event at a time. Measured under the
load of eight threads settling one message at a time (issue 24), a command
took 26 ms (p50) from its append to the engine, while a librdkafka consumer of
the same partitions, in the same minute, read it 1.1 ms after its append; an
acquire waited for that hop, and the hop cost the engine about a fifth of its
time.

Faust keeps what it does well: the group membership that decides which worker
owns which engine partitions, the tables and their recovery, the timers. This
consumer is only ever *assigned* the commands partitions Faust gave this
worker, once their tables are recovered (``on_rebalance_complete``), from
where Faust's group committed them (:class:`GroupOffsets`), and an offset
is committed there only once the commands before it were applied (their
commit records are in Kafka), as Faust did: a crash loses nothing, and the
commands after the last commit run again, which their ids make harmless.
Faust's own consumer leaves the commands partitions alone
(:func:`streams.kafka_tuning.leave_to_intake`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, TopicPartition

from topics.commands import QUIET_FETCH_WAIT_MS, WAKE_BYTES
from topics.connection import ConnectionSettings
from topics.offsets import GapGuard, position_of, take

log = logging.getLogger(__name__)
#: the name of the reader's consumer (only ever assigned: it commits nothing)
READER = "engine-commands"
#: how often the applied offsets are committed (Faust's broker_commit_interval)
COMMIT_INTERVAL_S = 1.0
#: how long a read waits for a first record (it returns as soon as one comes):
#: how late a job of the event loop (an assignment, the lag) and shutdown
#: (it waits for the read) run at most. Each empty read wakes the thread
#: and takes the GIL: at 0.05 s, the engine spent 5.0-5.1% of a core waiting
#: for brokers that were away; confluent-kafka wakes every 0.2 s within a
#: poll anyway (to look for signals), so waiting longer saves little.
_READ_WAIT_S = 0.2
#: how long an assignment waits for the commands topic's leaders (else
#: librdkafka finds them within a second)
_METADATA_WAIT_S = 2.0
#: how long shutdown waits for the last commit
_CLOSE_WAIT_S = 5.0
#: batches read and not yet taken by the event loop, at most: the reader
#: waits beyond (what it has not read stays in librdkafka's queue, bounded
#: by its own settings)
_QUEUED_BATCHES = 4

T = TypeVar("T")


class GroupOffsets(Protocol):
    """Where the consumer group that owns the commands partitions (Faust's)
    keeps how far each was applied."""

    async def committed(self, partitions: list[int]) -> dict[int, int]:
        """The committed offset of each of ``partitions`` (negative: none);
        raises :class:`KafkaException` or :class:`TimeoutError` in a few
        seconds at most (the assignment waits for it, and asks again)."""

    async def commit(self, offsets: dict[int, int]) -> None:
        """Commit ``offsets`` (partition -> the next offset to apply)."""


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """A record of the commands topic, as the engine reads it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    #: stamped by the broker when appended (``LogAppendTime``), not by its producer
    log_append_time: bool


def large_tail(records: list[CommandRecord], quiet: Callable[[CommandRecord], bool],
               large: int) -> tuple[list[CommandRecord], list[CommandRecord]]:
    """``records`` as two batches to apply one after the other: the second
    is the run of ``quiet`` records (nobody waits for their answers) at the
    end, if their values hold at least ``large`` bytes; else it is empty."""
    tail = len(records)
    while tail and quiet(records[tail - 1]):
        tail -= 1
    if sum(len(r.value or b"") for r in records[tail:]) < large:
        return records, []
    return records[:tail], records[tail:]


class CommandIntake:
    """Reads the commands partitions this worker owns, in batches.

    Every call on the consumer is made by its reader thread, between two
    reads (a commit made from another thread while it read waited for
    seconds, or for ever): the event loop hands it jobs (:meth:`_in_reader`).
    The assignment therefore changes only between two reads, each read is
    tagged with the assignment it was made under, and records read under an
    earlier one are dropped, to be read again from where they were.
    """

    def __init__(self, settings: ConnectionSettings, topic: str, offsets: GroupOffsets,
                 max_batch: int, *, linger: Callable[[CommandRecord], float] = lambda _: 0.0,
                 ) -> None:
        self._topic = topic
        #: where the group that owns the partitions keeps how far they were applied
        self._offsets = offsets
        self._max_batch = max_batch
        #: how long a record may be held for more to join it (0: somebody
        #: waits for it); what was read is handed over once the least linger
        #: of its records passed, with what arrived meanwhile (:meth:`_join_later`)
        self._linger = linger
        config = settings.consumer_config(READER)
        if settings.profile.wakes_waiting_fetches:
            # commands nobody waits for are read a few to a fetch; one
            # somebody waits for wakes the fetch (topics.commands.WAKE_BYTES)
            config.update({"fetch.min.bytes": WAKE_BYTES,
                           "fetch.wait.max.ms": QUIET_FETCH_WAIT_MS})
        self._consumer = Consumer(config)
        #: commands are applied in their order, none passed over (Tansu)
        self._in_order = GapGuard(topic, enabled=settings.profile.skips_unfinished_appends)
        #: partition -> the next offset to hand out (records before it are repeats)
        self._next: dict[int, int] = {}
        #: partition -> the offset after the last applied command, not yet committed
        self._applied: dict[int, int] = {}
        #: partition -> the offset after the last applied command (for the lag)
        self._done: dict[int, int] = {}
        #: partition -> the offset the group holds as applied: no worker reads
        #: a command before it again (:meth:`committed`)
        self._committed: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        #: what the reader read, with the assignment it was read under
        self._batches: asyncio.Queue[tuple[int, list[CommandRecord]]] = asyncio.Queue()
        #: how many more batches the reader may queue (backpressure): taken
        #: by the reader, given back as the loop takes them (:meth:`_hand_over`)
        self._room = threading.Semaphore(_QUEUED_BATCHES)
        #: the number of the consumer's assignment, changed by the reader only
        self._generation = 0
        #: whether the consumer has partitions to read (else the reader waits for jobs)
        self._reading = False
        #: how many assignments were asked for (a later one ends an earlier one's retries)
        self._assignments = 0
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = \
            queue.SimpleQueue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="engine-commands", daemon=True)

    # ----------------------------------------------------------- the event loop's side
    async def next_batch(self) -> list[CommandRecord]:
        """The next records of the partitions this worker owns, in order per
        partition, at most ``max_batch``: all that arrived meanwhile."""
        self._start()
        while True:
            got = self._fresh(*await self._batches.get())
            self._room.release()
            while len(got) < self._max_batch and not self._batches.empty():
                got += self._fresh(*self._batches.get_nowait())
                self._room.release()
            if got:
                return got

    def _fresh(self, generation: int, records: list[CommandRecord]) -> list[CommandRecord]:
        """``records`` read under the current assignment and not handed out yet."""
        if generation != self._generation:
            return []
        fresh = []
        for record in records:
            expected = self._next.get(record.partition)
            if expected is not None and record.offset >= expected:
                self._next[record.partition] = record.offset + 1
                fresh.append(record)
        return fresh

    def not_read_again(self, records: list[CommandRecord]) -> list[CommandRecord]:
        """Those of ``records``, handed out earlier and held back, that this
        worker still reads and will not read again: across a rebalance, a
        partition given up is its new owner's to apply, and one assigned
        anew is read again from where it was applied up to."""
        return [r for r in records if self._next.get(r.partition, -1) > r.offset]

    def applied(self, records: list[CommandRecord]) -> None:
        """``records`` ran: their offsets may be committed."""
        for record in records:
            if record.partition in self._next:
                done = max(self._done.get(record.partition, 0), record.offset + 1)
                self._applied[record.partition] = self._done[record.partition] = done

    async def lag(self) -> dict[int, int]:
        """Per commands partition read: the commands appended and not applied
        yet (as far as the consumer knows the partition's end; a partition
        read from its beginning counts from offset 0 until a command ran)."""
        done = dict(self._done)

        def ends() -> dict[int, int]:
            return {p: self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, p), cached=True)[1] for p in done}

        return {p: max(0, end - done[p]) for p, end in (await self._in_reader(ends)).items()
                if end >= 0}

    async def assign(self, partitions: set[int]) -> None:
        """Read exactly ``partitions`` from now on: those kept go on where
        they are, new ones start where their commands were applied up to.
        Asked again while the broker cannot say where (every second, until a
        later assignment replaces this one)."""
        self._assignments += 1
        this = self._assignments
        new = sorted(partitions - set(self._next))
        while True:
            try:
                committed = await self._offsets.committed(new) if new else {}
                # Never applied: from offset 0 (auto.offset.reset takes a
                # trimmed partition to its log start), not OFFSET_BEGINNING,
                # which librdkafka first resolves with a request of its own.
                starts = {p: max(0, o) for p, o in committed.items()}
                break
            except (KafkaException, TimeoutError) as exc:
                log.warning("cannot read where commands partitions %s were applied up to (%s); "
                            "asking again in a second", new, str(exc) or "no answer in time")
                await asyncio.sleep(1.0)
                if this != self._assignments:
                    return
        for partition in set(self._next) - partitions:
            del self._next[partition]
            self._done.pop(partition, None)
            self._committed.pop(partition, None)
        self._next.update(starts)
        self._done.update(starts)
        self._committed.update(starts)
        positions = [TopicPartition(self._topic, p, o) for p, o in self._next.items()]
        await self._in_reader(lambda: self._reassign(positions))
        if new:
            log.info("reading commands partitions %s from offsets %s", new,
                     [starts[p] for p in new])

    async def revoke(self, partitions: set[int]) -> None:
        """Stop reading ``partitions`` and commit how far they were applied:
        their new owner goes on from there (or, if the commit does not get
        through in time, runs the last commands again)."""
        gone = partitions & set(self._next)
        if not gone:
            return
        await self.assign(set(self._next) - gone)
        offsets = self._to_commit(gone)
        if not offsets:
            return
        try:
            await asyncio.wait_for(self._offsets.commit(offsets), _CLOSE_WAIT_S)
        except (TimeoutError, KafkaException):
            log.warning("could not commit the applied offsets of commands partitions %s in "
                        "time; their next owner runs their last commands again", sorted(gone))

    async def commit_every(self, interval: float = COMMIT_INTERVAL_S) -> None:
        """Commit the applied offsets every ``interval`` seconds, for ever."""
        while True:
            await asyncio.sleep(interval)
            if offsets := self._to_commit():
                try:
                    await self._offsets.commit(offsets)
                    self._committed.update(
                        (p, o) for p, o in offsets.items() if p in self._next)
                except KafkaException as exc:
                    # The commands after the last commit run again after a
                    # restart: repeats, which their command ids make harmless.
                    log.warning("could not commit the applied commands offsets %s (%s)",
                                offsets, exc)

    def committed(self) -> dict[int, int]:
        """Per commands partition this worker reads: the offset its group
        holds as applied. Every command before it was applied and is read by
        no worker again (a new owner starts there), so the log may be
        trimmed up to it (:mod:`streams.log_trimmer`)."""
        return dict(self._committed)

    def close(self) -> None:
        """Stop reading. (What was applied since the last commit runs again
        at the next start: Faust's consumer has left the group by now.)"""
        if self._thread.is_alive():
            self._closed.set()
            self._jobs.put((lambda: None, Future()))  # wakes a reader waiting for jobs
            self._thread.join(timeout=_CLOSE_WAIT_S)
        if self._thread.is_alive():  # every consumer call is the reader's (see the class)
            log.warning("the commands reader did not stop within %.0f s; its consumer is left "
                        "to the process's exit", _CLOSE_WAIT_S)
            return
        self._consumer.close()

    def _to_commit(self, partitions: set[int] | None = None) -> dict[int, int]:
        """The applied offsets not committed yet (of ``partitions``; None: all)."""
        chosen = [p for p in self._applied if partitions is None or p in partitions]
        return {p: self._applied.pop(p) for p in chosen}

    def _start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._thread.start()

    async def _in_reader(self, job: Callable[[], T]) -> T:
        """Run ``job`` on the reader thread, between two reads."""
        self._start()
        done: Future[T] = Future()
        self._jobs.put((job, done))
        return await asyncio.wrap_future(done)

    # --------------------------------------------------- the reader thread's side
    def _reassign(self, positions: list[TopicPartition]) -> None:
        """Assign ``positions``: what was read before is read again."""
        self._consumer.assign(positions)
        self._in_order.moved(positions)
        self._generation += 1
        self._reading = bool(positions)
        if positions:
            # librdkafka looks up the leaders of a topic new to a consumer
            # that has been idle on its once-a-second topic scan: the first
            # fetch of an engine that just started waited 0.5 s for it.
            # Asking for the topic's metadata now starts the fetch at once.
            try:
                self._consumer.list_topics(self._topic, timeout=_METADATA_WAIT_S)
            except KafkaException:
                pass  # brokers away: the scan finds the leaders when they are back

    def _run_jobs(self, wait: float = 0.0) -> None:
        """Run the jobs queued, after waiting up to ``wait`` for a first."""
        while True:
            try:
                job, done = self._jobs.get(timeout=wait) if wait else self._jobs.get_nowait()
            except queue.Empty:
                return
            wait = 0.0
            try:
                result = job()
            except Exception as exc:  # noqa: BLE001 (handed to whoever waits for it)
                _hand_over_outcome(done.set_exception, exc)
            else:
                _hand_over_outcome(done.set_result, result)

    def _read(self) -> None:
        """The reader thread: :meth:`_read_on` until closed. An error it did
        not expect is logged and reading goes on a second later: a reader
        that ended would leave the worker reading no command again, and its
        next assignment waiting for it for ever."""
        while True:
            try:
                self._read_on()
                return
            except Exception:
                log.exception("the commands reader failed; reading on in a second")
                if self._closed.wait(1.0):
                    return

    def _read_on(self) -> None:
        """Hand what the consumer read to the event loop, as it comes; wait
        while the loop has enough queued (backpressure)."""
        loop = self._loop
        assert loop is not None
        while True:
            # With nothing to read, a job (the first assignment) runs at
            # once rather than after an empty read of _READ_WAIT_S.
            self._run_jobs(wait=0.0 if self._reading else _READ_WAIT_S)
            if self._closed.is_set():
                return
            if not self._reading:
                continue
            generation = self._generation
            try:
                records = self._take(self._max_batch, _READ_WAIT_S)
                if records:
                    self._join_later(records)
            except KafkaException as exc:  # a broker fault
                log.warning("reading the commands failed (%s); reading again", exc)
                continue
            if records and not self._hand_over(loop, generation, records):
                return

    def _take(self, most: int, wait: float) -> list[CommandRecord]:
        """Up to ``most`` records, waiting at most ``wait`` for the first."""
        records = []
        for message in self._in_order.admit(self._consumer, take(self._consumer, most, wait)):
            if message.error() is not None:
                log.warning("commands partition error: %s", message.error())
                continue
            partition, offset = position_of(message)
            kind, stamp = message.timestamp()
            records.append(CommandRecord(partition, offset, message.key(), message.value(),
                                         stamp, kind == TIMESTAMP_LOG_APPEND_TIME))
        return records

    def _join_later(self, records: list[CommandRecord]) -> None:
        """While nobody waits for ``records``, add what arrives within the
        least linger of those read, until a record somebody waits for comes
        or the batch is full: the engine then applies them together, and the
        event loop is woken once for them."""
        started = time.monotonic()
        deadline = math.inf
        fresh = records
        while True:
            for record in fresh:
                linger = self._linger(record)
                if linger <= 0:
                    return
                deadline = min(deadline, started + linger)
            left = deadline - time.monotonic()
            if left <= 0 or len(records) >= self._max_batch:
                return
            try:
                fresh = self._take(self._max_batch - len(records), left)
            except KafkaException as exc:
                # What was read is handed over all the same: the consumer has
                # moved past it, and the next read meets the fault again.
                log.warning("reading more commands failed (%s); handing over the %d read",
                            exc, len(records))
                return
            records += fresh

    def _hand_over(self, loop: asyncio.AbstractEventLoop, generation: int,
                   records: list[CommandRecord]) -> bool:
        """Queue ``records`` for the event loop, waiting while it has
        :data:`_QUEUED_BATCHES` queued (running its jobs meanwhile: a
        rebalance must not wait for a busy engine); False once the loop is
        closed. The reader then reads on at once: it used to wait for the
        loop to take each batch (a coroutine put on the loop and its future
        waited for), which cost every batch a task and a wake of this thread
        by the loop: under eight threads settling one message at a time the
        engine spent 8 % more CPU a message (91 against 84 us, four trials
        each, interleaved, 2026-12-06)."""
        while not self._room.acquire(timeout=_READ_WAIT_S):
            self._run_jobs()
            if self._closed.is_set():
                return False
        try:
            loop.call_soon_threadsafe(self._batches.put_nowait, (generation, records))
        except RuntimeError:  # the loop closed: nobody reads any more
            return False
        return True


def _hand_over_outcome(setter: Callable[[Any], None], outcome: Any) -> None:
    """Give a job's outcome to its future, unless whoever waited for it was
    cancelled meanwhile (an assignment cut short by the next rebalance): the
    job ran all the same, and the reader reads on. (Setting a cancelled
    future raised in the reader thread and ended it: the worker read no
    command again, and its next assignment waited for ever.)"""
    try:
        setter(outcome)
    except InvalidStateError:
        pass
