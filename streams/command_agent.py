"""The agent that answers every command: acquire, settle, stats, peek..., and
runs the engine's own operations (expire, accept, dead_forwarded).

One command record carries a whole batch of offsets, so one record read and
one small set of writes serve many messages. A command commits in one record:
the window's header, carrying what the command wrote (its *redo*) and the
events it produced (its *outbox*). Only once Kafka holds that record is the
command answered; then, within ``FOLLOW_UP_DELAY_S`` and together with those
of the window's next commands, its writes go to their own keys and its events
to the events topic. Until Kafka holds those too, the window's next commit record
carries them again, so a record's redo and outbox always cover everything of
its window not yet acknowledged, and no command waits for them. A crash
at any point leaves either nothing of the command (it is processed again from
the commands topic, or retried by its client under the same command id), or
its header, whose redo and outbox are applied again when the window is next
loaded: state and events together, or not at all. Events published twice
carry the same command id, which readers drop as repeats.

Batches overlap: once a batch's commit records are sent (and its writes
stored locally, where the next commands read them), the next batch is
applied while Kafka acknowledges them. Nothing leaves before the state it
reports is in Kafka: a batch's answers, its refusals included, and its
follow-ups wait for its own commit records, and for the batches before it;
its commands' offsets are committed only after that. A later commit record of
a window carries the writes of the earlier ones still on their way, as it
carries follow-ups not yet acknowledged, so a record that Kafka holds always
covers what its window's answers said.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from faust.types import TP, StreamT

from streams import sessions
from streams.app import (
    answers,
    app,
    commands_topic,
    commits,
    engine_partitions,
    entries,
    events_topic,
    header_lines,
    headers,
    records,
    replies_topic,
    settings,
    state_topic,
    window_partition,
)
from streams.command_intake import CommandIntake, CommandRecord, large_tail
from streams.definitions import Definitions
from streams.engine_worker import COMMIT_REFUSED_EXIT
from streams.log_clock import LogClock
from streams.states import Event, Refused
from streams.store import Txn
from streams.table_store import TableStore
from streams.throttle import CommandThrottle
from streams.window import InflightWindow
from topics import names, specs
from topics.commands import (
    TICK_KEY,
    Command,
    CommandError,
    Op,
    Policy,
    Reply,
    ReplyAddress,
    SettleArgs,
    StatsArgs,
    answered_by_no_one,
    decode_command,
    encode_reply,
    final_at_append,
    sent_quiet,
)
from topics.entities import NAMESPACE_KEY
from topics.errors import ErrorCode
from topics.events import (
    encode_record,
    event_record,
    is_event,
    merge_event,
    own_event,
    record_key,
    state_record,
)
from topics.offsets import committed_offsets

log = logging.getLogger(__name__)
#: The largest header record (with its redo and outbox) the engine writes:
#: under the 1 MB that Kafka brokers and producers accept by default.
MAX_COMMIT_BYTES = 900_000
#: window key -> writes and events of its commit records on their way to
#: Kafka under their own keys: the window's next record carries them again
_unsettled: dict[bytes, list[_Unsettled]] = {}
#: windows whose stored redo and outbox this worker has applied since it got them
_recovered: set[bytes] = set()
#: window key -> (the header record this worker wrote last, its fields): a
#: header is parsed only when another worker wrote it
_written: dict[bytes, tuple[bytes, dict[str, Any]]] = {}
_followed: list[Definitions] = []
#: ticks on their way to the commands topic (see request_tick)
_ticks: set[asyncio.Future[Any]] = set()
#: called (in a thread) with the key of each window the engine forgets
on_window_dropped: list[Callable[[str], None]] = []
#: called with each client command admitted (not the engine's own operations)
#: and when Kafka appended it (ms, the commands topic's log time)
on_client_command: list[Callable[[Command, int], None]] = []
#: called with every command as it is answered, with its result, or the code
#: it is refused with; also those nobody waits for (quiet settlements, the
#: engine's own operations)
on_answered: list[Callable[[Command, dict[str, Any], ErrorCode | None], None]] = []
#: the namespace's limit of commands per second, as this worker applies it
_throttle = CommandThrottle()
#: commands and the engine's own operations, one at a time (they share windows)
_one_at_a_time = asyncio.Lock()
#: the time of each commands partition, as its log says (streams/log_clock.py),
#: up to the records the engine has applied: what the engine's own operations
#: (lapses, accepts) are judged at. It moves on only once the records read
#: before it are applied: read ahead, an expiry waiting its turn lapsed a
#: session at the time of a tick behind settlements of it not yet applied.
clock = LogClock()
#: the same, up to the records read: each command's own time as it is read
_read_clock = LogClock()
#: called with a commands partition whose time a tick moved on (the lock timer
#: runs what came due there)
on_tick: list[Callable[[int], Awaitable[None]]] = []
#: commands partition -> set once its time is known (see run_internal)
_time_known: dict[int, asyncio.Event] = {}
#: how long the engine's own operation waits for its partition's time
_TIME_WAIT_S = 5.0
#: most commands run together (group commit)
MAX_BATCH = 500
#: batches whose commit records may be on their way to Kafka at once while
#: the next one is applied (a few cover the wait: each is a few ms)
_IN_FLIGHT_BATCHES = 4
_in_flight = asyncio.Semaphore(_IN_FLIGHT_BATCHES)
#: answers of the batch being applied, held until its commit records are in
#: Kafka (None: not applying a batch of commands; answers go at once)
_held_answers: contextvars.ContextVar[list[tuple[ReplyAddress, Reply]] | None] = \
    contextvars.ContextVar("held_answers", default=None)
#: how long reading where the commands partitions were applied up to may take
_COMMITTED_WAIT_S = 5.0


class _FaustGroupOffsets:
    """The commands partitions' offsets in Faust's group. They are read with
    a request of their own, bounded in time (Faust's consumer asks again for
    ever, silently, and an assignment waits for the read), so that a read
    that fails is logged and asked again. They are committed through
    Faust's consumer, a member of the group (the intake's consumer then
    never looks for a group coordinator: with the brokers away that cost the
    engine a hundredth of a core; and a worker no longer in the group's
    generation cannot commit)."""

    async def committed(self, partitions: list[int]) -> dict[int, int]:
        # A one-shot client: librdkafka's default back-off, not the engine's
        # (a new client's first connection waits half of it).
        config = replace(settings, reconnect_backoff_ms=None).kafka_config()
        return await asyncio.to_thread(committed_offsets, config, app.conf.id,
                                       commands_topic.get_topic_name(), partitions,
                                       _COMMITTED_WAIT_S)

    async def commit(self, offsets: dict[int, int]) -> None:
        topic = commands_topic.get_topic_name()
        thread = app.consumer._thread  # type: ignore[attr-defined]
        await thread.commit({TP(topic, p): o for p, o in offsets.items()})


#: how long a batch of commands nobody waits for (settlements final once
#: appended, ticks) waits for more to join it. A thread that settles one
#: message at a time appends one every 0.5-1 ms; applied one by one, the
#: engine's main thread spent 0.7 ms of a core on each (its batch, commit
#: record, follow-up and their acknowledgements; issue 24, one thread:
#: 61 % of a core at 871 msg/s), the brokers on the same cores the rest.
#: With 5 ms: 40 % at 1,056 msg/s (make bench, one thread: 1,138 -> 1,219);
#: with 20 ms 33 % (1,344). make bench of 2026-11-29, 20 ms against 5 ms,
#: two runs of each interleaved: one thread 2,901-3,004 against 2,713-2,779
#: msg/s (the engine 0.24 of a core against 0.34), 8 threads 4,744-5,635
#: against 4,304-4,631, asyncio 11,960-13,216 against 11,901-11,953. With
#: 50 ms (harnesses of 2026-12-07, the code before and after in turn): a
#: topic's 3 subscriptions settling one by one 2,619 -> 2,860 msg/s (16
#: trials each), the engine 0.33-0.40 -> 0.26-0.31 of a core; one thread,
#: 8 threads, asyncio and ``process`` 2-8 % faster, the engine's CPU a
#: message 10-20 % lower. A receive ends the wait all the same (one comes
#: every 40 ms or so in those phases). Nobody is kept waiting: a command
#: someone waits for ends the wait, and a settlement is judged by when it
#: was appended, not applied (docs/settlement-by-log.md).
QUIET_LINGER_S = 0.050
#: What is held is applied before the next command somebody waits for: a
#: session's settlements, held 20 ms, stood in front of its release and the
#: next session's lock (bench-sessions of 2026-11-27: lock p50 11.9 ->
#: 13.4-14.3 ms, 2,000-2,050 msg/s; with 5 ms 11.8 ms, 2,347). Settlements
#: of entities that require sessions, and ticks, are held 5 ms (bench-sessions
#: of 2026-11-29 with the 20 ms for the others: 3,260-3,323 msg/s against
#: 3,254-3,413).
SESSION_QUIET_LINGER_S = 0.005
#: Settlements nobody waits for of at least this many bytes together (about
#: 400 messages of one acquire, which travel as one group of offsets and
#: their log times, ~21 bytes each: ``complete_messages`` of a large batch;
#: 32 KB when each travelled as a list of seven fields) are work enough by
#: themselves: they are not held for more to join them, and they are applied
#: after the answers somebody waits for rather than in front of them
#: (:func:`_after_answers`).
LARGE_QUIET_BYTES = 8 * 1024


def _linger(record: CommandRecord) -> float:
    """How long the intake may hold ``record`` for more to join it: read
    from its bytes (a key that names no entity is the engine's to refuse,
    not the intake's) and the definitions followed, in the intake's thread."""
    if not answered_by_no_one(record.key, record.value) \
            or len(record.value or b"") >= LARGE_QUIET_BYTES:
        return 0.0
    if record.key == TICK_KEY or not _followed:
        return SESSION_QUIET_LINGER_S
    entity = (record.key or b"").decode(errors="replace").rpartition("#")[0]
    found = _followed[0].policy(entity)
    if found is None or found[1].requires_session:
        return SESSION_QUIET_LINGER_S
    return QUIET_LINGER_S


#: the engine's reader of the commands partitions it owns
intake = CommandIntake(settings, commands_topic.get_topic_name(), _FaustGroupOffsets(),
                       MAX_BATCH, linger=_linger)
#: Fault injection for tests: the worker exits (as after ``kill -9``) right
#: after the commit record of the first command of this operation is
#: acknowledged, before its writes and events are sent.
_EXIT_AFTER_COMMIT = os.environ.get("SETTLEMENT_FAULT_EXIT_AFTER_COMMIT")


def definitions() -> Definitions:
    """The entities' policies, followed from the first command on."""
    if not _followed:
        _followed.append(Definitions(settings))
    return _followed[0]


@app.agent(commands_topic)
async def process_commands(stream: StreamT) -> None:
    """Only subscribes: this agent makes Faust's group assign the commands
    partitions (and the tables with them), which the engine then reads
    itself (:data:`intake`); Faust's consumer hands their records to no
    stream (:func:`streams.kafka_tuning.leave_to_intake`)."""
    async for _ in stream.events():
        log.error("Faust delivered a command, which the engine reads itself: ignored")


@app.task
async def run_batches() -> None:
    """Run the commands read, in batches (group commit): a batch takes all
    that arrived meanwhile, so a lone command runs at once and a busy engine
    runs what queued meanwhile together. The next batch is applied while
    Kafka acknowledges this one's commit records (:func:`_finish`)."""
    before: asyncio.Future[None] | None = None
    later: list[CommandRecord] = []
    while True:
        if later:  # held back by _after_answers: once the batch before is answered
            if before is not None:
                await asyncio.wait([before])
            records, later = intake.not_read_again(later), []
        else:
            records, later = _after_answers(await intake.next_batch())
        if not records:
            continue
        await _in_flight.acquire()
        held = _held_answers.set([])
        pending = None
        try:
            pending = await _handle(records, before)
        except CommitRefused as exc:  # one committed early, as a record would grow too large
            _stop(exc)
        except Exception:  # never let one batch stop the engine
            log.exception("a batch of %d commands failed", len(records))
        finally:
            refusals = _held_answers.get() or []
            _held_answers.reset(held)
        before = asyncio.ensure_future(_finish(records, pending, refusals, before))


def _after_answers(records: list[CommandRecord]
                   ) -> tuple[list[CommandRecord], list[CommandRecord]]:
    """``records`` as two batches, the second the large settlements nobody
    waits for after the last command somebody does: the event loop runs one
    batch at a time, and applied in the same batch, they held back the
    answers for their whole run; applied next, while Kafka acknowledges the
    first, they held back the acknowledgements' callbacks. So the second
    runs once the batch before is answered. (Receive 1,000 +
    complete_messages on Apache Kafka, harness, interleaved phases: ~43,600
    -> ~47,300 msg/s; each acquire's answer had waited 3-4 ms for the
    settlement of 1,000 sent after it.)"""
    return large_tail(records, lambda r: answered_by_no_one(r.key, r.value), LARGE_QUIET_BYTES)


async def _finish(records: list[CommandRecord], pending: _Answering | None,
                  refusals: list[tuple[ReplyAddress, Reply]],
                  before: asyncio.Future[None] | None) -> None:
    """After the batches before it: once every window of a batch is answered
    (each once Kafka holds its commit record, :func:`_execute`), send its
    refusals; only then may its commands' offsets be committed."""
    try:
        if before is not None:
            await before
        if pending is not None:
            await pending.finish()
    except CommitRefused as exc:
        _stop(exc)
    except Exception:  # never let one batch stop the engine
        log.exception("a batch of %d commands failed", len(records))
    finally:
        for address, reply in refusals:
            _send_answer(address, reply)
        intake.applied(records)
        _in_flight.release()


@app.task
async def _commit_applied() -> None:
    await intake.commit_every()


@app.on_rebalance_complete.connect
async def _forget_recovered(sender: object, /, *_: object, **__: object) -> None:
    """A window that moved away and back may carry another worker's redo.
    The tables are recovered: the commands partitions may be read."""
    _recovered.clear()
    _written.clear()
    _drop_waiting()
    _unsettled.clear()  # another worker may have written these windows since
    clock.forget()
    _read_clock.forget()
    for known in _time_known.values():
        known.clear()
    await intake.assign(_owned())


@app.on_partitions_revoked.connect
async def _stop_reading(sender: object, /, *args: object, **__: object) -> None:
    """Partitions given up: their new owner reads on from what was applied."""
    revoked = cast(set[TP], args[0])
    topic = commands_topic.get_topic_name()
    # A batch running now is not waited for (its acknowledgements may wait
    # for brokers that are away): its commands are not committed, and the
    # new owner runs them again, as their ids allow.
    await intake.revoke({tp.partition for tp in revoked if tp.topic == topic})


@app.on_before_shutdown.connect
async def _close_intake(sender: object, /, *_: object, **__: object) -> None:
    intake.close()


def _owned() -> set[int]:
    """The commands partitions Faust assigned this worker."""
    topic = commands_topic.get_topic_name()
    return {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}


def _observe(each: LogClock, record: CommandRecord) -> None:
    each.observe(record.partition, record.offset, record.timestamp_ms, record.log_append_time)


def _applied(records: Sequence[CommandRecord]) -> None:
    """``records`` are applied: the engine's clock moves on to them."""
    for record in records:
        _observe(clock, record)
        _time_known.setdefault(record.partition, asyncio.Event()).set()


async def _handle(records: Sequence[CommandRecord], before: asyncio.Future[None] | None
                  ) -> _Answering | None:
    """Apply ``records``; their windows' answers on their way, once Kafka
    holds their commit records and the batch ``before`` is answered (None:
    nothing to wait for)."""
    runs: list[_Run] = []
    ticked: dict[int, None] = {}
    for record in records:
        _observe(_read_clock, record)
        partition = record.partition
        if record.key == TICK_KEY:
            ticked[partition] = None
            continue
        try:
            cmd = _admit(record)
        except Exception:  # one unreadable record must not cost the batch its other commands
            log.exception("could not read the command at partition %d offset %d; skipped",
                          partition, record.offset)
            continue
        if cmd is not None:
            runs.append(_Run(cmd, partition, record.timestamp_ms, _read_clock.now(partition)))
    pending = None
    if runs:
        async with _one_at_a_time:
            try:
                pending = await _execute(runs, before)
            finally:  # a batch that failed is over too: its commands are released
                _applied(records)
    else:
        _applied(records)
    for partition in ticked:
        for sweep in on_tick:
            await sweep(partition)
    return pending


def _admit(record: CommandRecord) -> Command | None:
    """The command ``record`` holds, if it is well-formed, routed to its
    window's partition and within the namespace's limit; else it is
    answered here, and None."""
    try:
        cmd = decode_command(record.value or b"")
    except CommandError as exc:
        log.warning("rejected command at partition %d offset %d: %s",
                    record.partition, record.offset, exc)
        if exc.reply is not None and exc.command_id:
            _answer(exc.reply, Reply(exc.command_id, exc.reply.client, False,
                                     error_code=exc.code, error_message=str(exc)))
        return None
    cmd = _judged_by_append(cmd, record)
    right = window_partition(cmd.window_key)
    if record.key != cmd.window_key.encode() or record.partition != right:
        _reject(cmd, ErrorCode.MISROUTED,
                f"command for window {cmd.window_key} must be keyed by it and sent to "
                f"partition {right}")
        return None
    if not _admitted(cmd):
        return None
    for hook in on_client_command:
        hook(cmd, record.timestamp_ms)
    return cmd


def _judged_by_append(cmd: Command, record: CommandRecord) -> Command:
    """A settlement sent quiet is final once appended only if Kafka appended
    it early enough (:func:`topics.commands.final_at_append`, the rule its
    client judged the same append by). Appended too late, its client sends
    the same id again and waits for the answer: it is applied as a command
    somebody waits for, answered, its answer kept."""
    args = cmd.args
    if not isinstance(args, SettleArgs) or not args.quiet or final_at_append(
            record.timestamp_ms if record.log_append_time else None, args.until):
        return cmd
    return Command(cmd.id, cmd.entity, cmd.partition, SettleArgs(args.items), cmd.reply)


def request_tick(partition: int) -> None:
    """Append a tick to a commands partition, so that its time moves on
    (:mod:`streams.log_clock`). A tick anyone appends only tells the time
    the broker stamped on it: harmless. One that fails is logged; the timer
    asks again at its next round."""
    tick = asyncio.ensure_future(commands_topic.send(key=TICK_KEY, value=b"",
                                                     partition=partition))
    _ticks.add(tick)
    tick.add_done_callback(_ticked)


def _ticked(tick: asyncio.Future[Any]) -> None:
    _ticks.discard(tick)
    if not tick.cancelled() and tick.exception() is not None:
        log.warning("could not append a tick to the commands topic (%s); the timer asks "
                    "again", tick.exception())


def _admitted(cmd: Command) -> bool:
    """Whether the namespace's limit of commands per second lets a client's
    command run. If not, it is answered ``ServerBusy`` before the window
    sees it, so no answer is recorded and its retry (same id) runs. The
    administration client's ``stats`` on the namespace's own record (it
    waits for a new limit to be read) always runs: a raised limit must get
    through. The engine's own operations (:func:`run_internal`) never come
    here. Settlements always run: one that reached the log while its lock
    held is final (docs/settlement-by-log.md), and they end work rather than
    start it."""
    if (cmd.entity == NAMESPACE_KEY and cmd.op is Op.STATS) or isinstance(cmd.args, SettleArgs):
        return True
    limit = definitions().max_commands_per_second
    now = time.monotonic()
    if _throttle.admit(limit, _share() if limit is not None else 0.0, now):
        return True
    _answer_refusal(cmd, ErrorCode.SERVER_BUSY,
                    f"namespace {settings.namespace!r} is over its limit of {limit} engine "
                    "commands per second: wait 10 seconds and try again (clients do this on "
                    "their own)")
    if refused := _throttle.refused_to_report(now):
        log.warning("answered ServerBusy to %d command(s) since the last report: namespace "
                    "%r is over its limit of %s commands per second", refused,
                    settings.namespace, limit)
    return False


def _share() -> float:
    """This worker's share of the commands topic's partitions: the share of
    the namespace's limit it admits."""
    topic = commands_topic.get_topic_name()
    mine = sum(1 for tp in app.consumer.assignment() if tp.topic == topic)
    return max(mine, 1) / engine_partitions


async def run_internal(*cmds: Command) -> None:
    """Run operations of the engine's own timers or scanner on windows this
    worker owns, together (one commit round for all: the scanner's accepts of
    a topic's subscriptions). They never travel on the commands topic, so no
    client can forge one; they wait their turn with the commands."""
    runs = []
    for cmd in cmds:
        partition = window_partition(cmd.window_key)
        if TP(commands_topic.get_topic_name(), partition) not in app.consumer.assignment():
            continue  # the window moved to another worker, whose timers take over
        if clock.now(partition) is None and not await _time_of(partition):
            log.warning("no time for commands partition %d after %.0f s: %s on %s waits for "
                        "the next round", partition, _TIME_WAIT_S, cmd.op, cmd.window_key)
            continue
        runs.append(_Run(cmd, partition, -1, None))
    if runs:
        async with _one_at_a_time:
            await (await _execute(runs)).finish()


async def _time_of(partition: int) -> bool:
    """Whether the time of a commands partition this worker got is known
    within a while: a tick appended there tells it."""
    request_tick(partition)
    known = _time_known.setdefault(partition, asyncio.Event())
    try:
        await asyncio.wait_for(known.wait(), _TIME_WAIT_S)
    except TimeoutError:
        return False
    return True


@dataclass
class _Run:
    """A command to run, with when it was appended (-1: the engine's own
    operation) and its partition's time when it was read (None: take it
    when it runs)."""

    cmd: Command
    partition: int
    sent_ms: int
    now: int | None


@dataclass
class _Chunk:
    """What commands of one window wrote and announced since its last commit
    record: the next one carries it all (group commit)."""

    key: bytes
    store: TableStore
    header_store: TableStore
    window: InflightWindow
    writes: dict[bytes, bytes | None] = field(default_factory=dict)
    #: event records, in order
    events: list[dict[str, Any]] = field(default_factory=list)
    #: state records by key: a later summary of the window or of a session
    #: replaces an earlier one (the state topic is compacted by that key)
    states: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    answers: list[tuple[Command, dict[str, Any]]] = field(default_factory=list)
    #: about how much its commands add to its record (see _size), and how
    #: much the record carries of the window's earlier ones (see _carried)
    size: int = 0
    carried: int = 0
    changed: bool = False
    ops: set[str] = field(default_factory=set)

    @property
    def outbox(self) -> list[dict[str, Any]]:
        return [*self.events, *self.states.values()]

    def add(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            if not is_event(record):
                self.states[record_key(record)] = record
            elif not (self.events and merge_event(self.events[-1], record)):
                self.events.append(own_event(record))

    def seal(self) -> None:
        """Add the window's summary as the commit leaves it (once per record,
        not per command: the compacted state topic keeps only the last)."""
        summary = state_record(self.window.summary(), int(time.time() * 1000))
        self.states[record_key(summary)] = summary

    def record(self) -> bytes:
        """The commit record: this chunk's writes and events, after those of
        the window's earlier records that Kafka does not hold yet."""
        writes: dict[bytes, bytes | None] = {}
        outbox: list[dict[str, Any]] = []
        for unsettled in _unsettled.get(self.key, []):
            writes.update(unsettled.writes)
            outbox += unsettled.outbox
        writes.update(self.writes)
        return self.window.commit_record(writes, outbox + self.outbox)


async def _execute(runs: list[_Run], before: asyncio.Future[None] | None = None
                   ) -> _Answering:
    """Run commands, window by window in the order they came: each window
    applies its commands one after the other in memory, and one commit
    record per window makes them all durable. A window's record is sent as
    soon as it is applied, and its commands are answered once Kafka holds
    it and the batch ``before`` is answered, while the next windows apply:
    different windows do not wait for each other (the acquires of a topic's
    ten subscriptions, fetched together, had all waited 100-107 ms for the
    last to be applied)."""
    by_window: dict[bytes, list[_Run]] = {}
    for run in runs:
        by_window.setdefault(run.cmd.window_key.encode(), []).append(run)
    early: list[asyncio.Future[None]] = []
    if len(by_window) > 1:
        # Windows are independent: those with a command somebody waits for
        # go first, the others (settlements final at their append, the
        # engine's own operations) after them.
        by_window = dict(sorted(by_window.items(), key=lambda kv: not _awaited(kv[1])))
    last: _Pending | None = None
    for key, group in by_window.items():
        if last is not None:  # a window applied before this one: answered meanwhile
            early.append(asyncio.ensure_future(_answer_when_held(last, before)))
            last = None
            await _let_answers_out()
        try:
            chunk = await _apply_group(key, group)
        except Exception:  # one window's failure must not stop the others
            log.exception("commands on window %s failed", key.decode())
            continue
        if chunk is not None:
            last = _send_commit([chunk])
    return _Answering(early, last)


#: turns of the event loop between two windows of a batch: a window's
#: answers go out once its acknowledgement's report has resolved its future
#: (one turn), the gather of its records' futures has followed (another),
#: and its answering task has woken from its wait for the batch before and
#: then for them (two or three more). With one turn, a batch of a topic's
#: ten subscriptions' acquires, 3 ms a window to apply, was answered all at
#: once after the last (the engine's own trace: applied 26-58 ms after
#: publishing ended, every answer at 59-60 ms); a turn costs microseconds.
_ANSWER_TURNS = 5


async def _let_answers_out() -> None:
    """Let the acknowledgements in and the answers of the windows applied
    before out, before the next window is applied."""
    for _ in range(_ANSWER_TURNS):
        await asyncio.sleep(0)


def _awaited(group: list[_Run]) -> bool:
    """Whether a command of ``group`` has a caller waiting for its answer."""
    return any(run.cmd.reply is not None and not sent_quiet(run.cmd) for run in group)


async def _answer_when_held(pending: _Pending, before: asyncio.Future[None] | None) -> None:
    """Answer a window's commands once Kafka holds its commit record and
    the batch before is answered (in the order of the batches)."""
    _held_answers.set(None)  # this task's own copy: its answers go at once
    if before is not None:
        await asyncio.wait([before])  # not cancelled with this task
    await pending.finish()


@dataclass
class _Answering:
    """The windows of a batch (:func:`_execute`): those answered on their own
    while the next applied, and the last, answered by whoever finishes the
    batch (a batch of one window, as most are, is answered as before)."""

    early: list[asyncio.Future[None]]
    last: _Pending | None

    async def finish(self) -> None:
        """Once every window is answered; raises the first window's failure."""
        failures: list[BaseException] = []
        if self.last is not None:
            try:
                await self.last.finish()
            except Exception as exc:
                failures.append(exc)
        if self.early:  # most batches are one window: nothing to gather
            outcomes = await asyncio.gather(*self.early, return_exceptions=True)
            failures += [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            # a window whose commit record Kafka did not take stops the worker
            raise next((f for f in failures if isinstance(f, CommitRefused)), failures[0])


#: Consecutive settle commands of a window (as one thread settling one
#: message at a time sends them) are applied in one transaction of at most
#: this many commands and items, no text among them: what they write is then
#: far below MAX_COMMIT_BYTES, as one settle command's is, and none is refused
#: for its size (a quiet settlement's client took it as final).
_SETTLED_TOGETHER = 200
_ITEMS_TOGETHER = 1000


async def _apply_group(key: bytes, group: list[_Run]) -> _Chunk | None:
    """Apply a window's commands in order; the chunk to commit, or None."""
    partition = group[0].partition
    store = TableStore(entries, partition, records)
    header_store = TableStore(headers, partition, commits)
    raw = header_store.get(key)
    if raw is not None and key not in _recovered:
        await _recover(raw, store)
        _recovered.add(key)
    known = definitions()
    chunk: _Chunk | None = None
    together = _Together()
    for run in group:
        cmd, now = run.cmd, run.now if run.now is not None else clock.now(partition)
        if now is None:  # forgotten by a rebalance while this waited its turn
            if run.sent_ms < 0:
                continue  # the engine's own operation: the next round runs it
            now = run.sent_ms
        if isinstance(cmd.args, StatsArgs) and cmd.args.version >= 0:
            await known.read_up_to(cmd.args.version)
        if chunk is None:
            chunk = await _open_chunk(key, raw, cmd, store, header_store)
            if chunk is None:
                continue
        policy = await known.policy_as_of(cmd.entity, run.sent_ms if run.sent_ms >= 0 else now)
        if policy is None and names.SUBSCRIPTIONS in cmd.entity and cmd.op is not Op.STATS:
            # A subscription's window must start where the subscription began,
            # which only its definition says (stats changes nothing: the
            # administration client asks it after a deletion).
            _reject(cmd, ErrorCode.MESSAGING_ENTITY_NOT_FOUND,
                    f"subscription {cmd.entity!r} does not exist: create it with "
                    "ServiceBusAdministrationClient.create_subscription")
            continue
        joins = together.takes(chunk.window, cmd, policy)
        if together.cmds and not joins:
            chunk = await _apply_together(chunk, together)
            together = _Together()
            joins = together.takes(chunk.window, cmd, policy)
        if joins:
            together.add(cmd, now, policy)
        else:
            chunk = await _apply_one(chunk, cmd, now, policy)
    if chunk is not None and together.cmds:
        chunk = await _apply_together(chunk, together)
    return chunk


@dataclass
class _Together:
    """Settle commands of one window waiting to be applied together."""

    cmds: list[tuple[Command[SettleArgs], int]] = field(default_factory=list)
    policy: tuple[int, Policy] | None = None
    items: int = 0

    def takes(self, window: InflightWindow, cmd: Command, policy: tuple[int, Policy] | None
              ) -> bool:
        """Whether ``cmd`` may join: a settlement without texts, under the
        same policy, on a window without sessions, within the limits."""
        args = cmd.args
        return (isinstance(args, SettleArgs) and not window.requires_session
                and (policy is None or not policy[1].requires_session)
                and (not self.cmds or policy == self.policy)
                and len(self.cmds) < _SETTLED_TOGETHER
                and self.items + len(args.items) <= _ITEMS_TOGETHER
                and all(i.reason is None and i.description is None for i in args.items))

    def add(self, cmd: Command, now: int, policy: tuple[int, Policy] | None) -> None:
        assert isinstance(cmd.args, SettleArgs)
        self.cmds.append((cast(Command[SettleArgs], cmd), now))
        self.policy = policy
        self.items += len(cmd.args.items)


async def _apply_together(chunk: _Chunk, together: _Together) -> _Chunk:
    """Apply the settlements gathered in ``together`` (a lone one as any command)."""
    if len(together.cmds) == 1:
        cmd, now = together.cmds[0]
        return await _apply_one(chunk, cmd, now, together.policy)
    done = chunk.window.apply_settlements(together.cmds, together.policy)
    answered: list[tuple[Command, dict[str, Any]]] = []
    outbox: list[dict[str, Any]] = []
    for (cmd, _), each in zip(together.cmds, done.each, strict=True):
        if isinstance(each, Refused):
            _reject(cmd, each.code, str(each))
            continue
        result, events = each
        answered.append((cmd, result))
        outbox += _event_records(chunk.window, events, cmd.id)
    if not done.changed:
        chunk.answers += answered
        return chunk
    return await _take(chunk, answered, done.writes, outbox)


async def _apply_one(chunk: _Chunk, cmd: Command, now: int,
                     policy: tuple[int, Policy] | None) -> _Chunk:
    """Apply ``cmd`` on its own; the chunk that holds it (a new one if the
    one before had to be committed first)."""
    try:
        # Refused only before anything changes (sessions.guard)
        outcome = chunk.window.apply(cmd, now, policy)
    except Refused as refused:
        _reject(cmd, refused.code, str(refused))
        return chunk
    if not outcome.changed:
        chunk.answers.append((cmd, outcome.result))
        return chunk
    outbox = _event_records(chunk.window, outcome.events, cmd.id)
    size = _size(outcome.writes, outbox)
    if size > MAX_COMMIT_BYTES:
        # Too large alone: what came before commits, this is undone.
        await _commit([chunk])
        await _settled(chunk.key)  # the next record then carries only what follows
        reopened = await _open_chunk(chunk.key, chunk.header_store.get(chunk.key), cmd,
                                     chunk.store, chunk.header_store)
        _reject(cmd, ErrorCode.STATE_TOO_LARGE,
                f"what this {cmd.op} would store for {cmd.window_key} is about "
                f"{size} bytes, more than the {MAX_COMMIT_BYTES} the engine writes at "
                "once: send fewer messages per call, or shorter dead-letter reasons "
                "and descriptions")
        assert reopened is not None  # its header was just written by this worker
        return reopened
    return await _take(chunk, [(cmd, outcome.result)], outcome.writes, outbox)


async def _take(chunk: _Chunk, answered: list[tuple[Command, dict[str, Any]]],
                writes: dict[bytes, bytes | None], outbox: list[dict[str, Any]]) -> _Chunk:
    """Add what commands wrote and announced to the chunk, which answers
    them once committed; committed first if the record would grow too large."""
    size = _size(writes, outbox)
    if chunk.carried + chunk.size + size > MAX_COMMIT_BYTES:
        # The record would be too large: commit first, and wait for Kafka
        # to hold it all.
        await _commit([chunk])
        await _settled(chunk.key)  # the next record then carries only what follows
        chunk = _Chunk(chunk.key, chunk.store, chunk.header_store, chunk.window,
                       carried=_carried(chunk.key))
    txn = chunk.window.store
    assert isinstance(txn, Txn)
    for k, v in writes.items():
        txn.put(k, v) if v is not None else txn.delete(k)
    chunk.writes.update(writes)
    chunk.add(outbox)
    chunk.answers += answered
    chunk.size += size
    chunk.changed = True
    chunk.ops.update(cmd.op for cmd, _ in answered)
    return chunk


async def _open_chunk(key: bytes, raw: bytes | None, cmd: Command, store: TableStore,
                      header_store: TableStore) -> _Chunk | None:
    """The window of ``cmd`` over a transaction on its store, ready for a
    group of commands; None (and ``cmd`` refused) if it is unreadable."""
    window = _load(key, raw, cmd, Txn(store))
    if window is None:
        return None
    if raw is not None and window.policy_version < definitions().deleted_at(cmd.entity):
        # The queue was deleted after this window adopted its policy: what
        # is stored belongs to the deleted queue, not to one of the same name.
        _written.pop(key, None)
        await _settled(key)
        await _drop(key, raw, store, header_store)
        window = InflightWindow(cmd.entity, cmd.partition, Txn(store))
    return _Chunk(key, store, header_store, window, carried=_carried(key))


def _carried(key: bytes) -> int:
    """About how much a new commit record of window ``key`` carries before
    its own commands: what its earlier records committed and Kafka does not
    hold yet (:meth:`_Chunk.record`). Counted, so that two large commits in
    a row (the scanner's accepts of a crowded session queue) cannot add up
    to a record larger than Kafka takes."""
    return sum(u.size for u in _unsettled.get(key, []))


def _size(writes: dict[bytes, bytes | None], outbox: list[dict[str, Any]]) -> int:
    """About how much a command adds to a commit record (JSON escapes a
    little; reasons and descriptions are in the writes and in the events)."""
    return (sum(len(k) + len(v or b"") + 8 for k, v in writes.items()) * 2
            + 200 * len(outbox))


async def _commit(chunks: list[_Chunk]) -> None:
    """Write the commit record of each chunk, all at once; once Kafka holds
    them, send their writes and events, and answer their commands."""
    await _send_commit(chunks).finish()


class CommitRefused(Exception):
    """Kafka did not take the commit records of a batch (refused them, or
    librdkafka gave up after ``message.timeout.ms``)."""

    def __init__(self, windows: list[str], cause: BaseException) -> None:
        super().__init__(f"Kafka did not take the commit record of {', '.join(windows)}: "
                         f"{cause}")


def _stop(exc: CommitRefused) -> None:
    """End the worker at once, its commands' offsets not committed (but for
    this, a batch that failed is marked applied: :func:`_finish`). The
    worker's local tables already hold what the batch wrote, and the
    window's next command here would send it again; but the offsets of a
    batch marked applied are committed, and a worker taking the partition
    over rebuilds the window from the changelogs, without the batch, and
    never reads its commands again (a settlement final at its append would
    be lost). Stopped, whoever reads the partition next applies them again:
    this worker started again (its header's redo is sent as it loads), or
    another. As after ``kill -9``, nothing else is lost."""
    log.critical("%s. The worker stops without committing the commands since its last "
                 "commit; start it again (a deployment's restart policy does) once Kafka "
                 "takes the engine's records: they are applied again from the commands "
                 "topic", exc)
    logging.shutdown()
    os._exit(COMMIT_REFUSED_EXIT)


@dataclass
class _Pending:
    """Commit records on their way to Kafka, and what waits for them."""

    chunks: list[_Chunk]
    #: the chunks that changed their window, with their writes and events
    changed: list[tuple[_Chunk, _Unsettled]]
    acks: asyncio.Future[Any]

    async def finish(self) -> None:
        """Once Kafka holds the records: answer their commands, and send
        their writes and events under their own keys."""
        try:
            await self.acks
        except Exception as exc:
            # Not in Kafka: the window is loaded again from its stored
            # header (_held), whose redo and outbox are sent again.
            for _, unsettled in self.changed:
                if not unsettled.sent.done():
                    unsettled.sent.set_exception(exc)
            raise CommitRefused([c.key.decode(errors="replace") for c, _ in self.changed],
                                exc) from exc
        if _EXIT_AFTER_COMMIT and any(_EXIT_AFTER_COMMIT in c.ops for c, _ in self.changed):
            log.warning("exiting after the commit record of %s", _EXIT_AFTER_COMMIT)
            os._exit(137)  # fault injection: the tests' crash point
        # Answers before the follow-up: a command's caller waits for its answer only.
        for chunk in self.chunks:
            for cmd, result in chunk.answers:
                _reply_ok(cmd, result)
        if self.changed:
            _follow_up(self.changed)


def _send_commit(chunks: list[_Chunk]) -> _Pending:
    """Send the commit record of each chunk, all at once, and store their
    writes locally: the next commands read them while Kafka acknowledges."""
    changed = [c for c in chunks if c.changed]
    for chunk in changed:
        chunk.seal()
    records = [c.record() for c in changed]
    acks = asyncio.gather(*(c.header_store.write(c.key, r)
                            for c, r in zip(changed, records, strict=True)))
    if len(_written) > 10_000:
        _written.clear()
    for chunk, record in zip(changed, records, strict=True):
        header_lines.noted(chunk.key, record)
        # copies: a window that goes on applying commands changes its own dicts
        _written[chunk.key] = (record, {k: dict(v) if isinstance(v, dict) else v
                                        for k, v in chunk.window.header().items()})
    return _Pending(chunks, [(chunk, _store_committed(chunk)) for chunk in changed], acks)


def parsed_header(key: bytes, raw: bytes | None) -> dict[str, Any] | None:
    """The header of window ``key`` parsed, if ``raw`` is the record this
    worker wrote last for it (None: ``raw`` is to be parsed). A window's
    loaded fields never change the lists and dicts of the header in place."""
    mine = _written.get(key)
    return mine[1] if mine is not None and mine[0] == raw else None


def _load(key: bytes, raw: bytes | None, cmd: Command, store: Txn) -> InflightWindow | None:
    try:
        return InflightWindow.load(raw, cmd.entity, cmd.partition, store,
                                   parsed_header(key, raw))
    except (ValueError, KeyError, TypeError) as exc:
        log.error("window %s is unreadable (%s); leaving it untouched", cmd.window_key, exc)
        _reject(cmd, ErrorCode.STATE_UNREADABLE,
                f"the engine cannot read the state of {cmd.window_key}")
        return None


def _event_records(window: InflightWindow, events: list[Event], command_id: str
                   ) -> list[dict[str, Any]]:
    """Settlement events (one record per kind), then the summaries of the
    sessions the command changed, for the state topic (the records without a
    ``type``); the window's own summary is added once per commit record
    (:meth:`_Chunk.seal`).

    Each event names the command that caused it, so readers can drop the
    repeats a recovery publishes again, by (cmd, type, entity, partition)."""
    now = int(time.time() * 1000)
    records = [event_record(ev.type, window.entity, window.partition, ev.offsets, ev.count,
                            now, command_id, ev.extra) for ev in events]
    return [*records, *(state_record(summary, now) for summary in sessions.summaries(window, now))]


#: How long a window's committed writes and events wait before they are sent
#: under their own keys: the commands of the next milliseconds rewrite the same
#: keys (the window's entries chunk, its lock index, its summary), and one
#: record per key then serves them all (eight threads settling one by one: the
#: engine's librdkafka threads 0.07 cores instead of 0.12, 2,180-2,430 msg/s
#: instead of 2,150, warm Kafka, idle machine). Until Kafka holds them, every
#: commit record of the window carries them (:meth:`_Chunk.record`).
FOLLOW_UP_DELAY_S = 0.01
#: what a window's waiting follow-ups may add up to before they are sent at
#: once: every commit record of the window carries them meanwhile
FOLLOW_UP_MAX_BYTES = MAX_COMMIT_BYTES // 4


@dataclass
class _Unsettled:
    """A window's committed writes and events that Kafka does not hold yet."""

    writes: dict[bytes, bytes | None]
    outbox: list[dict[str, Any]]
    store: TableStore
    size: int
    #: resolves once Kafka holds them (cancelled: dropped by a rebalance)
    sent: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


#: window key -> its follow-ups not handed to Kafka yet, in order
_waiting: dict[bytes, list[_Unsettled]] = {}
#: the timer that hands them over, while one is set (a box, not a global)
_follow_up_timer: list[asyncio.TimerHandle] = []


def _store_committed(chunk: _Chunk) -> _Unsettled:
    """Store a chunk whose commit record was sent locally at once (the next
    commands read it); until Kafka holds its writes and events under their
    own keys, the window's next commit records carry them."""
    for k, v in chunk.writes.items():
        chunk.store.put(k, v)
    unsettled = _Unsettled(chunk.writes, chunk.outbox, chunk.store, chunk.size)
    _unsettled.setdefault(chunk.key, []).append(unsettled)
    unsettled.sent.add_done_callback(functools.partial(_held, chunk.key, unsettled))
    return unsettled


def _follow_up(committed: list[tuple[_Chunk, _Unsettled]]) -> None:
    """Send the writes and events of chunks whose commit records Kafka holds,
    within :data:`FOLLOW_UP_DELAY_S`."""
    for chunk, unsettled in committed:
        if unsettled.sent.done():  # dropped by a rebalance meanwhile
            continue
        _waiting.setdefault(chunk.key, []).append(unsettled)
        if sum(u.size for u in _waiting[chunk.key]) > FOLLOW_UP_MAX_BYTES:
            _send_follow_ups(chunk.key)
    if _waiting and not _follow_up_timer:
        _follow_up_timer.append(asyncio.get_running_loop().call_later(
            FOLLOW_UP_DELAY_S, _send_waiting))


def _send_waiting() -> None:
    _follow_up_timer.clear()
    for key in list(_waiting):
        _send_follow_ups(key)


def _send_follow_ups(key: bytes) -> None:
    """Send the waiting follow-ups of window ``key``: each key's last value,
    every event in order, each state's last summary."""
    group = _waiting.pop(key, [])
    if not group:
        return
    writes: dict[bytes, bytes | None] = {}
    events: list[dict[str, Any]] = []
    states: dict[bytes, dict[str, Any]] = {}
    for unsettled in group:
        writes.update(unsettled.writes)
        for record in unsettled.outbox:
            if is_event(record):
                events.append(record)
            else:  # the state topic is compacted by key: the last one counts
                states[record_key(record)] = record
    store = group[-1].store
    sent = [store.send(k, v) for k, v in writes.items()]
    sent += _publish([*events, *states.values()])
    asyncio.gather(*sent).add_done_callback(functools.partial(_hand_over, group))


def _hand_over(group: list[_Unsettled], done: asyncio.Future[Any]) -> None:
    """Kafka's answer to a group of follow-ups, for each of them."""
    for unsettled in group:
        if unsettled.sent.done():
            continue
        if done.cancelled():
            unsettled.sent.cancel()
        elif (error := done.exception()) is not None:
            unsettled.sent.set_exception(error)
        else:
            unsettled.sent.set_result(None)


def _drop_waiting() -> None:
    """Forget the follow-ups not sent yet (a rebalance: the window's commit
    record carries them, and whoever loads it next applies them again)."""
    for group in _waiting.values():
        for unsettled in group:
            unsettled.sent.cancel()
    _waiting.clear()


def _held(key: bytes, unsettled: _Unsettled, done: asyncio.Future[Any]) -> None:
    """Kafka holds (or refused) a window's follow-up: its records no longer
    need to carry it."""
    waiting = _unsettled.get(key, [])
    if unsettled in waiting:
        waiting.remove(unsettled)
        if not waiting:
            del _unsettled[key]
    if not done.cancelled() and done.exception() is not None:
        # The window's latest record still carries it: loading the window
        # again applies that record's redo and outbox, which sends it again.
        log.warning("writes or events of window %s did not reach Kafka (%s); they are sent "
                    "again with the window's next command", key.decode(), done.exception())
        _recovered.discard(key)


async def _settled(key: bytes) -> None:
    """Wait until Kafka holds everything committed for the window ``key``."""
    _send_follow_ups(key)
    for unsettled in list(_unsettled.get(key, [])):
        await asyncio.gather(unsettled.sent, return_exceptions=True)


def _publish(outbox: list[dict[str, Any]]) -> list[asyncio.Future[Any]]:
    """Send the outbox, in order; each future resolves once Kafka
    acknowledged its record (until then the window's next commit record
    carries it again)."""
    sent: list[asyncio.Future[Any]] = []
    for record in outbox:
        topic = events_topic if is_event(record) else state_topic
        key = record_key(record)
        sent.append(records.send(topic.get_topic_name(), key, encode_record(record)))
        if record.get("gone"):  # compaction forgets the session
            sent.append(records.send(topic.get_topic_name(), key, None))
    return sent


async def _recover(raw: bytes, store: TableStore) -> None:
    """Apply the stored header's redo and publish its outbox again: the
    worker that wrote it may have died before they reached Kafka."""
    body = InflightWindow.body_of(raw)
    sent = [store.write(k, v) for k, v in InflightWindow.redo_of(body).items()]
    sent += _publish(body.get("outbox", []))
    await asyncio.gather(*sent)


async def _drop(key: bytes, raw: bytes, store: TableStore, header_store: TableStore) -> None:
    """Forget a deleted entity's window: its header and every key under it."""
    body = InflightWindow.body_of(raw)
    prefix = InflightWindow(body["entity"], body["partition"]).prefix
    await header_store.write(key, None)
    header_lines.noted(key, None)
    stale = [k for k, _ in store.range(prefix, prefix[:-1] + b"\x01")]
    await asyncio.gather(*(store.write(k, None) for k in stale))
    for hook in on_window_dropped:
        await asyncio.to_thread(hook, key.decode())


def _reply_ok(cmd: Command, result: dict[str, Any]) -> None:
    for hook in on_answered:
        hook(cmd, result, None)
    if cmd.reply is not None and not sent_quiet(cmd):
        _answer(cmd.reply, Reply(cmd.id, cmd.reply.client, True, result))


def _reject(cmd: Command, code: ErrorCode, message: str) -> None:
    log.warning("command %s (%s on %s): %s", cmd.id, cmd.op, cmd.window_key, message)
    _answer_refusal(cmd, code, message)


def _answer_refusal(cmd: Command, code: ErrorCode, message: str) -> None:
    for hook in on_answered:
        hook(cmd, {}, code)
    if cmd.reply is not None and not sent_quiet(cmd):
        _answer(cmd.reply, Reply(cmd.id, cmd.reply.client, False,
                                 error_code=code, error_message=message))


def _answer(address: ReplyAddress, reply: Reply) -> None:
    """Send an answer, once the state it reports was acknowledged: those of
    a batch being applied wait for its commit records (:func:`_finish`)."""
    held = _held_answers.get()
    if held is not None:
        held.append((address, reply))
    else:
        _send_answer(address, reply)


def _send_answer(address: ReplyAddress, reply: Reply) -> None:
    """Send an answer through the answers' own sender: no follow-up record
    is ahead of it."""
    if address.partition >= specs.REPLY_PARTITIONS:  # forged: nobody reads there
        log.warning("not answering command %s: reply partition %d does not exist",
                    reply.id, address.partition)
        return
    sent = answers.send(replies_topic.get_topic_name(), reply.client.encode(),
                        encode_reply(reply), address.partition)
    sent.add_done_callback(_answered)


def _answered(sent: asyncio.Future[Any]) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("could not send an answer (%s); its sender will retry", sent.exception())
