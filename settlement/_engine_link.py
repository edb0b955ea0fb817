"""Request/reply with the engine over Kafka: commands out, answers back.

Each client owns one reply partition (picked at random) and a consumer
assigned to it; answers are matched to commands by id. A command that gets no
answer in time is sent again under the same id: the engine answers a
repeated id with its first answer, so a retry never grants or settles twice.

A settlement needs no answer when Kafka stamped it (LogAppendTime) before
the lock it settles ended: the engine judges it by that time, so it is final
once appended (``final_before_ms``; docs/settlement-by-log.md).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from settlement._retry import SERVER_BUSY_WAIT_S, RetryPolicy
from settlement.exceptions import (
    OperationTimeoutError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
    for_code,
)
from topics import names
from topics.commands import (
    ClientArgs,
    Command,
    Reply,
    ReplyAddress,
    SettleArgs,
    decode_reply,
    encode_command,
    final_at_append,
    wake_headers,
)
from topics.connection import ConnectionSettings
from topics.errors import ErrorCode
from topics.offsets import listed_end, take
from topics.partitions import command_partition

log = logging.getLogger(__name__)


#: how long one poll of the producer waits at most (a waiting caller's
#: turn to poll comes within it)
_POLL_S = 0.05
#: how many producers a client's link sends its commands through. A thread keeps
#: to one lane (its commands reach the log in the order it sent them), and
#: threads take lanes in turn. Threads sharing a producer wait for their
#: delivery reports through one of them (:meth:`EngineLink._wait_appended`),
#: a wake-up more for each report: three threads settling one message at a
#: time on three subscriptions settled 2,569 /s through one producer and
#: 2,775 /s with a lane each (the mean of twelve rounds each way, Apache
#: Kafka, 2026-12-01). All are made with the link, so that its threads and
#: connections do not grow with the threads that use it.
LANES = 4
#: errors of a reply partition asked for its end, retried besides those
#: topics.offsets.listed_end retries: the replies topic of a namespace made a
#: moment ago may not be known to the broker that answers yet
_NOT_READY = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT})


def check_reply(reply: Reply, entity_path: str) -> None:
    """Raise the error the engine answered, if it refused the command."""
    if not reply.ok:
        raise for_code(reply.error_code)(
            f"the engine refused a command on {entity_path}: {reply.error_message}",
            error_code=reply.error_code)


class EngineLink:
    """Sends commands to the engine and waits for their answers."""

    def __init__(self, settings: ConnectionSettings, *, attempt_timeout: float = 10.0,
                 retry: RetryPolicy | None = None, lanes: int = LANES) -> None:
        """``lanes``: how many producers send the commands (see LANES); one
        for a caller whose calls never overlap."""
        self.settings = settings
        self.client_id = uuid.uuid4().hex
        self.attempt_timeout = attempt_timeout
        self.retry = retry or RetryPolicy()
        #: entity -> time.monotonic() before which it is not sent to (busy)
        self._busy_until: dict[str, float] = {}
        self._commands_topic = names.commands(settings.namespace)
        #: whether a command waited for is padded to wake the engine's fetch
        #: (topics.commands.WAKE_BYTES)
        self._wakes = settings.profile.wakes_waiting_fetches
        #: whether Kafka stamps the commands it appends (LogAppendTime): until
        #: a delivery report says it does not (Tansu, or a commands topic made
        #: before), settlements are sent quiet; after, each is sent once,
        #: waited for, rather than quiet and then again
        self._stamps_appends = True
        self._lanes = [_Lane(self._new_producer()) for _ in range(lanes)]
        #: the next thread's lane (its index in ``_lanes``)
        self._turns = 0
        self._thread_lane = threading.local()
        metadata = self._lanes[0].producer.list_topics(timeout=10)
        topics = metadata.topics
        if self._commands_topic not in topics or names.replies(settings.namespace) not in topics:
            raise ServiceBusConnectionError(
                f"namespace {settings.namespace!r} is not provisioned on "
                f"{settings.bootstrap_servers}: start an engine worker "
                "('settlement worker --connection-string ...') or create a queue first"
            )
        self._engine_partitions = len(topics[self._commands_topic].partitions)
        reply_topic = names.replies(settings.namespace)
        self.reply_partition = random.randrange(len(topics[reply_topic].partitions))
        self._consumer = Consumer(settings.consumer_config(f"replies-{self.client_id}"))
        # ListOffsets may answer below the true end (Tansu); reading a few old
        # answers is harmless, they carry other client ids.
        try:
            end = listed_end(self._consumer, (reply_topic, self.reply_partition),
                             time.monotonic() + 10, also=_NOT_READY)
        except BaseException:  # nobody gets this link to close: its consumer goes now
            self._consumer.close()
            raise
        self._consumer.assign([TopicPartition(reply_topic, self.reply_partition, end)])
        self._waiting: dict[str, Future[Reply]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_replies, name="engine-replies", daemon=True),
            threading.Thread(target=self._serve_deliveries, name="engine-deliveries",
                             daemon=True)]
        for thread in self._threads:
            thread.start()

    def _new_producer(self) -> Producer:
        return Producer({**self.settings.kafka_config(), "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0})

    def _lane(self) -> _Lane:
        """The calling thread's lane: the one it was given, or the next in turn."""
        lane: _Lane | None = getattr(self._thread_lane, "lane", None)
        if lane is None:
            with self._lock:
                if self._closed.is_set():  # a call still running on another thread
                    raise ValueError(_CLOSED)
                lane = self._lanes[self._turns % len(self._lanes)]
                self._turns += 1
            self._thread_lane.lane = lane
        return lane

    def command(self, entity: str, partition: int, args: ClientArgs) -> Command[ClientArgs]:
        """A command for the window ``entity#partition``."""
        return Command(_command_id(), entity, partition, args,
                       ReplyAddress(self.reply_partition, self.client_id))

    def call(self, cmd: Command[ClientArgs], *, final_before_ms: int | None = None,
             timeout: float | None = None, meanwhile: Callable[[], None] | None = None
             ) -> Reply:
        """Send ``cmd`` and return its answer, retrying under the same id.

        ``final_before_ms``: ``cmd`` settles locks that end then (ms since
        the epoch); if Kafka appends it early enough, it is final and
        answered ok for every item without waiting for the engine.
        ``meanwhile``: run once Kafka has the command, while the engine
        works on it (not again for a retry)."""
        if final_before_ms is None or timeout is not None or not self._stamps_appends \
                or self._busy_until or meanwhile is not None:
            return self._call_many([cmd], timeout, final_before_ms, {}, meanwhile)[0]
        # A settlement that may be final at its append (most of those of a
        # thread settling one by one): sent quiet at once, and done when
        # Kafka appended it early enough. Anything else (a late or failed
        # append, none in time) goes on as call_many's first attempt would,
        # with this copy as one it sent: the same id, never sent quiet twice
        # while one is on its way. (Through call_many's lists, sets and
        # retry loop, a lone settlement cost its caller 20-25 us more.)
        _, appended = self._send(cmd, quiet_until=final_before_ms)
        self._wait_appended(appended, time.monotonic() + self.attempt_timeout)
        if appended.done and appended.error is None \
                and final_at_append(appended.stamp, final_before_ms):
            return _all_ok(cmd)
        return self._call_many([cmd], None, final_before_ms, {cmd.id: appended})[0]

    def start_call(self, cmd: Command[ClientArgs], *,
                   meanwhile: Callable[[], None] | None = None) -> Callable[[], Reply]:
        """Send ``cmd`` now; the function returned waits for its answer as
        :meth:`call` does (retries included), on whichever thread calls it.
        For a caller that must have its command in the log before the
        commands it sends next, and waits for the answer elsewhere."""
        sent = {cmd.id: self._send(cmd)}

        def answer() -> Reply:
            return self._call_many([cmd], None, None, {}, meanwhile, sent)[0]
        return answer

    def call_many(self, cmds: list[Command[ClientArgs]], *, timeout: float | None = None,
                  final_before_ms: int | None = None) -> list[Reply]:
        """Send several commands at once and wait for all of their answers.

        Commands without an answer in time, or answered busy, are sent again
        under their ids as the retry policy says; an entity answered busy is
        left alone for at least 10 s (its other callers wait too; calls on
        other entities do not). ``timeout`` (seconds) bounds the whole call,
        retries included, as the SDK's ``timeout=`` keyword does."""
        return self._call_many(cmds, timeout, final_before_ms, {})

    def _call_many(self, cmds: list[Command[ClientArgs]], timeout: float | None,
                   final_before_ms: int | None, quiet_copies: dict[str, _Append],
                   meanwhile: Callable[[], None] | None = None,
                   sent: dict[str, _Sent] | None = None) -> list[Reply]:
        """:meth:`call_many`, after the quiet copies ``quiet_copies`` were
        sent; ``meanwhile`` as :meth:`call` says; ``sent``: commands already
        sent once (:meth:`start_call`), their first attempt."""
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: dict[str, Reply] = {}
        pending = list(cmds)
        retried = 0
        while True:
            self._wait_while_busy({c.entity for c in pending})
            error = self._attempt(pending, replies, deadline, final_before_ms, quiet_copies,
                                  meanwhile, sent or {})
            meanwhile = sent = None
            if error is None:
                return [replies[c.id] for c in cmds]
            pending = [c for c in pending if c.id not in replies]
            wait = self.retry.next_wait(retried, error)
            if wait is None or (deadline is not None and time.monotonic() + wait >= deadline):
                raise error
            log.warning("%s; retry %d of %d in %.1f s", error.message, retried + 1,
                        self.retry.total, wait)
            time.sleep(wait)
            retried += 1

    def _attempt(self, cmds: list[Command[ClientArgs]], replies: dict[str, Reply],
                 call_deadline: float | None, final_before_ms: int | None,
                 quiet_copies: dict[str, _Append],
                 meanwhile: Callable[[], None] | None = None,
                 already: dict[str, _Sent] | None = None) -> ServiceBusError | None:
        """Send ``cmds`` once; put their answers in ``replies``, waiting
        ``attempt_timeout`` at most (or until ``call_deadline``). Returns the
        error that stands for those left without one (busy, timed out or
        not sent), None when every one was answered.

        ``quiet_copies``: the appends of the quiet copies sent by earlier
        attempts. A quiet copy still on its way is waited for again, not sent
        again: the engine keeps no answer of a quiet settlement final at its
        append, so a second copy appended after it would find its locks gone
        and be answered ``lock_lost``. The producer retries the copy itself,
        and reports it failed only when Kafka refused it, so a failed one is
        sent again."""
        started = time.monotonic()
        deadline = started + self.attempt_timeout
        if call_deadline is not None:
            deadline = min(deadline, call_deadline)
        sent: list[tuple[Command[ClientArgs], _Sent]] = []
        for cmd in cmds:
            earlier = quiet_copies.get(cmd.id)
            if already and cmd.id in already:
                sent.append((cmd, already[cmd.id]))
            elif earlier is not None and not (earlier.done and earlier.error):
                sent.append((cmd, (None, earlier)))
            elif final_before_ms is None or not self._stamps_appends:
                sent.append((cmd, self._send(cmd)))
            else:
                quiet = self._send(cmd, quiet_until=final_before_ms)
                quiet_copies[cmd.id] = quiet[1]
                sent.append((cmd, quiet))
        # The engine cannot answer a command before Kafka has it, and a new
        # producer's first record waits for its connection and producer id
        # (0.1-0.5 s): the attempt's wait for answers starts once they are
        # all appended, so that retries follow the policy's pace.
        appended_at = self._all_appended([appended for _, (_, appended) in sent], deadline)
        if appended_at is not None:
            deadline = appended_at + self.attempt_timeout
            if call_deadline is not None:
                deadline = min(deadline, call_deadline)
            if meanwhile is not None:
                meanwhile()
        error: ServiceBusError | None = None
        for cmd, (fut, appended) in sent:
            try:
                if fut is None:  # sent quiet: final if appended early enough
                    assert final_before_ms is not None  # what sending it quiet took
                    # (appended, or this attempt's time is up: _all_appended waited)
                    if final_at_append(appended.result(), final_before_ms):
                        replies[cmd.id] = _all_ok(cmd)
                        continue
                    # Appended too late to be final by itself: the same id again,
                    # answered (the engine answers a repeated id as it did the first).
                    fut, _ = self._send(cmd)
                    assert fut is not None
                reply = fut.result(max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                continue
            except ServiceBusCommunicationError as exc:
                error = exc
                continue
            finally:
                with self._lock:
                    self._waiting.pop(cmd.id, None)
            if reply.ok or reply.error_code != ErrorCode.SERVER_BUSY:
                replies[cmd.id] = reply
                continue
            with self._lock:
                self._busy_until[cmd.entity] = time.monotonic() + SERVER_BUSY_WAIT_S
            error = ServiceBusServerBusyError(
                f"the engine of namespace {self.settings.namespace!r} is busy: "
                f"{reply.error_message}", error_code=ErrorCode.SERVER_BUSY)
        left = next((c for c in cmds if c.id not in replies), None)
        if error is not None or left is None:
            return error
        return OperationTimeoutError(
            f"the engine of namespace {self.settings.namespace!r} did not answer {left.op} "
            f"on {left.window_key} within {deadline - started:.3g} s: check that an engine "
            "worker is running ('settlement worker')")

    def append(self, cmd: Command[ClientArgs], timeout: float | None = None) -> None:
        """Send ``cmd`` and return once Kafka appended it, without waiting for
        the engine's answer: for a command whose answer changes nothing for
        its caller (a session's release). The engine applies it in its turn,
        after every command appended to the partition before it."""
        appended = _Append(self, self._lane(), cmd.id)
        wait = self.attempt_timeout if timeout is None else timeout
        self._produce(cmd, appended)
        self._wait_appended(appended, time.monotonic() + wait)
        try:
            appended.result()
        except FutureTimeout:
            raise OperationTimeoutError(
                f"Kafka did not take {cmd.op} on {cmd.window_key} within {wait:.3g} s: "
                f"check that the brokers at {self.settings.bootstrap_servers} are up") from None

    def _wait_while_busy(self, entities: set[str]) -> None:
        """Sleep until none of ``entities`` is within its busy wait."""
        if not self._busy_until:  # no entity ever answered busy
            return
        with self._lock:
            until = max((self._busy_until.get(e, 0.0) for e in entities), default=0.0)
        pause = until - time.monotonic()
        if pause > 0:
            log.info("waiting %.1f s: the namespace answered busy for %s", pause,
                     ", ".join(sorted(entities)))
            time.sleep(pause)

    def _send(self, cmd: Command[ClientArgs], *, quiet_until: int | None = None) -> _Sent:
        """Produce ``cmd``: the futures of its answer and of its append (when
        Kafka stamped it, ms; None if the broker keeps the producer's time).
        With ``quiet_until``: a settlement sent quiet, of locks ending then,
        which the engine does not answer if it is final at its append, so no
        answer is waited for (None)."""
        fut: Future[Reply] | None = None
        appended = _Append(self, self._lane(), cmd.id)
        if quiet_until is None:
            fut = Future()
            with self._lock:
                self._waiting[cmd.id] = fut
        self._produce(cmd if quiet_until is None else _quiet(cmd, quiet_until), appended)
        return fut, appended

    def _produce(self, cmd: Command[ClientArgs], delivered: _Append) -> None:
        """Hand ``cmd`` to the producer of ``delivered``'s lane, waiting
        while its queue is full."""
        if self._closed.is_set():  # a call still running on another thread
            raise ValueError(_CLOSED)
        raw = encode_command(cmd)  # once, however long the queue stays full
        headers = wake_headers(raw) if self._wakes else None
        key = cmd.window_key.encode()
        partition = command_partition(cmd.window_key, self._engine_partitions)
        while True:
            try:
                delivered.lane.producer.produce(self._commands_topic, raw, key=key,
                                                headers=headers, partition=partition,
                                                on_delivery=delivered)
                break
            except BufferError:  # the delivery thread makes room
                time.sleep(0.01)

    def _failed(self, cmd_id: str, failed: ServiceBusCommunicationError) -> None:
        """Fail the call waiting for the answer to ``cmd_id``: Kafka refused it."""
        with self._lock:
            fut = self._waiting.pop(cmd_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(failed)

    def _wait_appended(self, appended: _Append, deadline: float) -> None:
        """Wait until ``appended`` is resolved or ``deadline`` passed
        (``time.monotonic()``). One waiting caller of a lane at a time runs
        its producer's delivery callbacks itself, for everyone's commands,
        and hands that on when its own is in: a caller alone gets its report
        first-hand. (Served by a thread of their own, each report woke that
        thread and then the caller: 0.1-0.2 ms of a 0.6 ms
        ``complete_message``. ``flush()`` from several threads would make
        each wait for every other's commands, and each of its polls may
        sleep 10 ms on an event another thread took.)"""
        lane = appended.lane
        while not appended.done and not self._closed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if lane.polling.acquire(blocking=False):
                try:
                    while (not appended.done and not self._closed.is_set()
                           and (left := deadline - time.monotonic()) > 0):
                        lane.producer.poll(min(left, _POLL_S))
                finally:
                    lane.polling.release()
                    lane.tell_waiters()  # one of them polls next
                return
            with lane.delivery:
                lane.waiters += 1
                try:
                    if not appended.done:
                        lane.delivery.wait(min(left, _POLL_S))
                finally:
                    lane.waiters -= 1

    def _all_appended(self, appends: list[_Append], deadline: float
                      ) -> float | None:
        """When (``time.monotonic()``) every one of ``appends`` was resolved,
        if they all were by ``deadline``; None otherwise (a failed append is
        raised where its command's answer is waited for)."""
        for appended in appends:
            self._wait_appended(appended, deadline)
            if not appended.done:
                return None
        return time.monotonic()

    def _serve_deliveries(self) -> None:
        """Run what the producer reports while no caller waits (its errors
        and logs): callers run their own delivery callbacks. A caller that
        found the turn taken by this thread is told when it is free again."""
        while not self._closed.wait(_POLL_S):
            for lane in list(self._lanes):
                if lane.polling.acquire(blocking=False):
                    try:
                        lane.producer.poll(0)
                    finally:
                        lane.polling.release()
                        lane.tell_waiters()

    def _read_replies(self) -> None:
        while not self._closed.is_set():
            try:
                records = take(self._consumer, 500, 0.1)
            except RuntimeError:  # consumer closed under us during shutdown
                return
            self._hand_out(records)

    def _hand_out(self, records: list[Message]) -> None:
        """Give each reply of ``records`` to the call waiting for it. A
        function of its own so that its variables end with it: a reply kept
        in the reading loop's variables until the next replies came (a
        receive's grants, two objects per message) outlived its receive, and
        the garbage collector moved it into its oldest generation, which it
        walks again and again."""
        for record in records:
            if record.error():
                continue
            reply = decode_reply(record.value())
            if reply is None or reply.client != self.client_id:
                continue
            with self._lock:
                fut = self._waiting.get(reply.id)
            if fut is not None and not fut.done():
                fut.set_result(reply)

    def close(self) -> None:
        self._closed.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._consumer.close()
        with self._lock:  # no thread is given a lane once closed
            lanes, self._lanes = self._lanes, []
            self._thread_lane = threading.local()
        for lane in lanes:
            lane.producer.flush(5)
        # Dropped, not kept: a logged error's traceback can keep this link
        # alive long after its client closed, and the producers' threads with
        # it (a closed sender drops its producer too). Nothing sends after close.
        del lanes


_CLOSED = "the client is closed: create a new ServiceBusClient"


class _Lane:
    """One producer of commands, and the callers waiting for its delivery
    reports: ``polling`` is held by the caller that runs its callbacks
    (:meth:`EngineLink._wait_appended`), the others wait on ``delivery``."""

    __slots__ = ("producer", "polling", "delivery", "waiters")

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.polling = threading.Lock()
        self.delivery = threading.Condition()
        #: callers waiting on ``delivery`` (nobody to tell: no lock taken)
        self.waiters = 0

    def tell_waiters(self) -> None:
        # Read without the lock: a caller counts itself in before it looks
        # whether its append is in, so it either sees the append or is told.
        # (Twice a complete_message, with nobody waiting in one thread.)
        if self.waiters:
            with self.delivery:
                self.delivery.notify_all()


class _Append:
    """When Kafka appended one command, filled in by its delivery report
    (this object is the producer's callback for it): ``stamp`` is Kafka's
    time (ms) if it stamped the append, None if the broker keeps the
    producer's; ``error`` if it could not be sent. (A concurrent Future,
    with its condition and lock, cost a one-by-one settlement 8-10 us.)"""

    __slots__ = ("_link", "lane", "_cmd_id", "done", "stamp", "error")

    def __init__(self, link: EngineLink, lane: _Lane, cmd_id: str) -> None:
        self._link = link
        #: the lane whose producer sends it and reports its delivery
        self.lane = lane
        self._cmd_id = cmd_id
        #: set last, once ``stamp`` or ``error`` is: what waiters poll
        self.done = False
        self.stamp: int | None = None
        self.error: ServiceBusCommunicationError | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        link = self._link
        if err is None:
            kind, stamp = msg.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                self.stamp = stamp
            else:
                link._stamps_appends = False
            self.done = True
            self.lane.tell_waiters()
            return
        self.error = ServiceBusCommunicationError(
            f"could not send a command to the engine: {err.str()}")
        self.done = True
        self.lane.tell_waiters()
        link._failed(self._cmd_id, self.error)

    def result(self) -> int | None:
        """``stamp``; raises ``error`` if sending failed, FutureTimeout if
        no report came yet."""
        if not self.done:
            raise FutureTimeout()
        if self.error is not None:
            raise self.error
        return self.stamp


#: a command sent: the future of its answer (None: sent quiet, not answered
#: if final at its append) and its append
_Sent = tuple[Future[Reply] | None, _Append]


def _command_id() -> str:
    """A random UUID4 as 32 hex digits, as ``uuid.uuid4().hex`` but without
    building a ``UUID`` (2.7 -> 0.8 us, once a call)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    return raw.hex()


def _quiet(cmd: Command[ClientArgs], until: int) -> Command[ClientArgs]:
    """``cmd`` sent to be final once appended (before ``until``, the end of
    its earliest lock): the engine does not answer it then."""
    assert isinstance(cmd.args, SettleArgs)
    # built directly: dataclasses.replace reads the fields each time (5 us a call)
    return Command(cmd.id, cmd.entity, cmd.partition,
                   SettleArgs(cmd.args.items, quiet=True, until=until), cmd.reply)


def _all_ok(cmd: Command[ClientArgs]) -> Reply:
    """The engine's answer to a settlement that is final once appended: ok
    for every item (it applies each, since each lock held when it was
    appended)."""
    assert isinstance(cmd.args, SettleArgs)
    # one pair for them all, read and never changed: a list each was a
    # thousand objects more for the garbage collector in a settlement of 1,000
    return Reply(cmd.id, cmd.reply.client if cmd.reply else "", True,
                 {"results": [_OK] * len(cmd.args.items)})


#: the answer of each item of a settlement final once appended
_OK = ("ok", 0)
